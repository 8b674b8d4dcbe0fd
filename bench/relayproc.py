"""One ``outbox-relay run`` subprocess, as an operator would start it, and what /proc says about it."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from bench import stats
from bench.acked_relay import ACK_LOG_ENV
from devservers import free_port

READY_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 60.0
CLAIM_HISTOGRAM = "outbox_relay_claim_duration_seconds"
#: Extra ``run`` options for every relay the bench starts, for A/B runs of a setting
#: (``BENCH_RELAY_ARGS="--batch-size 2000" python -m bench --only latency``).
EXTRA_ARGS_ENV = "BENCH_RELAY_ARGS"
#: A sink URL that runs :mod:`bench.null_relay`: the relay with no broker.
NULL_SINK = "null://"


class RelayProcess:
    """``python -m relay run`` with default settings plus ``extra``; log level WARNING.

    With ``note_acks`` it runs :mod:`bench.acked_relay` instead, the same CLI
    that also stamps each acknowledged event; :meth:`stamps` reads the stamps
    once the relay has stopped. A ``null://`` sink runs :mod:`bench.null_relay`,
    the same CLI with a sink that acknowledges everything at once.
    """

    def __init__(self, database_url: str, sink_url: str, *extra: str, note_acks: bool = False) -> None:
        self.metrics_port = free_port()
        self._ack_log: Path | None = None
        if note_acks:
            handle, name = tempfile.mkstemp(prefix="bench-acks-", suffix=".json")
            os.close(handle)
            self._ack_log = Path(name)
        if note_acks:
            module = "bench.acked_relay"
        elif sink_url.startswith(NULL_SINK):
            module = "bench.null_relay"
        else:
            module = "relay"
        self.args = [
            sys.executable, "-m", module, "run",
            "--database-url", database_url, "--sink", sink_url,
            "--log-level", "WARNING", "--metrics-port", str(self.metrics_port), *extra,
            *shlex.split(os.environ.get(EXTRA_ARGS_ENV, "")),
        ]  # fmt: skip
        self._log = tempfile.NamedTemporaryFile(prefix="bench-relay-", suffix=".log", delete=False)  # noqa: SIM115
        self._process: subprocess.Popen[bytes] | None = None
        self._ticks = os.sysconf("SC_CLK_TCK")

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def __enter__(self) -> RelayProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        if self._ack_log is not None:
            env[ACK_LOG_ENV] = str(self._ack_log)
        self._process = subprocess.Popen(
            self.args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env
        )
        self._wait_ready()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while True:
            self.check_alive()
            with contextlib.suppress(OSError):
                self.metrics()
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the relay did not serve /metrics within {READY_TIMEOUT_SECONDS:.0f}s")
            time.sleep(0.05)

    def check_alive(self) -> None:
        """Raise with the relay's log tail if it exited."""
        if self._process is not None and self._process.poll() is not None:
            raise RuntimeError(f"the relay exited with {self._process.returncode}: {self.log_tail()}")

    def log_tail(self, lines: int = 10) -> str:
        text = Path(self._log.name).read_text(errors="replace")
        return " | ".join(text.strip().splitlines()[-lines:]) or "(no output)"

    def warnings(self) -> int:
        """Lines the relay logged (at WARNING or above, its level here)."""
        return len(Path(self._log.name).read_text(errors="replace").strip().splitlines())

    def metrics(self) -> str:
        """The relay's /metrics text."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def claim_histogram(self) -> tuple[float, float]:
        """``(sum, count)`` of the claim-duration histogram right now."""
        return stats.histogram_sum_count(self.metrics(), CLAIM_HISTOGRAM)

    def cpu_seconds(self) -> float:
        """User plus system CPU the relay (all its threads) used so far."""
        return stats.proc_cpu_seconds(Path(f"/proc/{self.pid}/stat").read_text(), self._ticks)

    def peak_rss_bytes(self) -> int:
        """The relay's peak resident set (VmHWM)."""
        return stats.proc_status_bytes(Path(f"/proc/{self.pid}/status").read_text(), "VmHWM")

    def stop(self) -> int | None:
        """SIGTERM, wait for the batches in hand to settle; kill if it will not stop."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        self._process = None
        self._log.close()
        return code

    def stamps(self) -> dict[str, dict[str, float]]:
        """Idempotency key -> monotonic time, after ``stop``: ``acked`` when the broker's
        ack reached the relay, ``claimed`` when the event's claim returned."""
        if self._ack_log is None:
            raise RuntimeError("this relay was not started with note_acks")
        text = self._ack_log.read_text()
        data = json.loads(text) if text else {}
        return {kind: {str(key): float(at) for key, at in data.get(kind, {}).items()} for kind in ("acked", "claimed")}

    def discard_log(self) -> None:
        for path in (Path(self._log.name), self._ack_log):
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()
