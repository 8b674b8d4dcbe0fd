"""`outbox-relay run --metrics-port` waiting at start-up for a database that is not there yet.

The relay reaches PostgreSQL through the fault proxy, which first refuses
(resets) or swallows (black hole: every connect times out) the connections.
With `--startup-timeout` longer than the lease, the relay waits on purpose:
`/healthz` must answer 200 the whole time (a liveness probe that killed it
would only restart the wait) and `/readyz` 503; once the database is
reachable it starts, is ready, and stops with exit 0.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import psycopg
import pytest

from devservers import free_port, wait_for_port
from tests.faults.proxy import FaultProxy
from tests.faults.test_database_faults import via
from tests.relay_support import relay_process, stop_process, wait_until

#: relay_process's lease for a RabbitMQ sink; the wait watched outlasts it.
LEASE_SECONDS = 15.0


def status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["reset", "blackhole"])
def test_healthz_is_200_and_readyz_503_while_start_up_waits_past_the_lease_for_the_database(
    database_url: str, amqp_url: str, fault: str
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(database_url)
    port = free_port()
    with FaultProxy(str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432)))) as proxy:
        getattr(proxy, fault)()
        proc = relay_process(
            via(database_url, proxy), amqp_url, "--metrics-port", str(port), "--startup-timeout", "120"
        )
        try:
            wait_for_port("127.0.0.1", port)
            began, answers = time.monotonic(), []
            while time.monotonic() - began < LEASE_SECONDS + 5:
                at = round(time.monotonic() - began, 1)
                answers.append(
                    (at, status(f"http://127.0.0.1:{port}/healthz"), status(f"http://127.0.0.1:{port}/readyz"))
                )
                time.sleep(0.5)
            assert proc.poll() is None, "the relay gave up waiting"
            proxy.passthrough()
            wait_until(lambda: status(f"http://127.0.0.1:{port}/readyz") == 200, timeout=60)
            assert status(f"http://127.0.0.1:{port}/healthz") == 200
        finally:
            code = stop_process(proc)
        _, said = proc.communicate()
    dead = [a for a in answers if a[1] != 200]
    ready = [a for a in answers if a[2] != 503]
    assert dead == [], f"/healthz was not 200 while waiting (s, /healthz, /readyz): {dead[:5]} of {len(answers)}"
    assert ready == [], f"/readyz was not 503 while waiting: {ready[:5]} of {len(answers)}"
    assert code == 0, said[-3000:]
