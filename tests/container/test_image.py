"""The relay image: what it holds, who it runs as, how big it is and how fast it starts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from devservers import free_port
from tests.container.conftest import FIGURES, Containers, wait_for_healthz
from tests.container.engine import Base, Engine, numeric_user

pytestmark = [pytest.mark.container, pytest.mark.timeout(180, func_only=True)]

PROBE = Path(__file__).with_name("probe.py").read_text(encoding="utf-8")
#: The most the relay's own layers may add to the base: its packages' wheels are about 90 MB.
MAX_ADDED_MEGABYTES = 200


def probe(containers: Containers, *options: str) -> dict[str, Any]:
    """What ``probe.py`` finds in a container of the image (run with ``options``)."""
    done = containers.run("-c", PROBE, options=("--entrypoint", "python", *options))
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def test_image_holds_no_compiler_no_tests_no_git(containers: Containers) -> None:
    found = probe(containers)
    assert found["compilers"] == [], "the image holds a compiler"
    assert found["git"] == [], "the image holds a .git"
    assert found["importable"] == [], "the image holds what is not the product"
    assert found["outside_product"] == [], "outbox-relay installed files outside relay/, producers/, consumers/"
    assert found["src"] is False, "the build context was left in /src"


def test_the_probe_finds_what_it_looks_for(containers: Containers) -> None:
    # The same probe, in a container given what the image must not hold: it must see each.
    found = probe(
        containers,
        "--mount", "type=tmpfs,destination=/srv/app/.git",
        "--mount", "type=tmpfs,destination=/usr/local/lib/python3.11/site-packages/tests",
        "-v", "/bin/true:/usr/local/bin/gcc:ro",
        "-v", "/bin/true:/usr/libexec/gcc/x86_64-linux-gnu/12/cc1:ro",
    )  # fmt: skip
    assert "/srv/app/.git" in found["git"]
    assert found["importable"] == ["tests"]
    assert {"/usr/local/bin/gcc", "/usr/libexec/gcc/x86_64-linux-gnu/12/cc1"} <= set(found["compilers"])


def test_image_runs_as_its_non_root_numeric_user(
    engine: Engine, image: str, containers: Containers, relay_database: str, amqp_url: str
) -> None:
    user = engine.inspect(image, image=True)["Config"]["User"]
    ids = numeric_user(user)
    assert ids is not None, f"USER {user!r} is not numeric: orchestrators cannot check runAsNonRoot"
    assert 0 not in ids, f"USER {user} is root"
    found = probe(containers)
    assert (found["uid"], found["gid"]) == ids
    # The relay itself, as the image starts it: every user and group id of its process.
    assert containers.run("migrate", env={"RELAY_DATABASE_URL": relay_database}).returncode == 0
    port = free_port()
    name = containers.start(
        env={"RELAY_DATABASE_URL": relay_database, "RELAY_SINK": amqp_url,
             "RELAY_METRICS_PORT": str(port)},
    )  # fmt: skip
    wait_for_healthz(port)
    status = containers.exec(name, "cat", "/proc/1/status").stdout
    process = {line.split(":")[0]: line.split()[1:] for line in status.splitlines() if line.startswith(("Uid", "Gid"))}
    assert process == {"Uid": [str(ids[0])] * 4, "Gid": [str(ids[1])] * 4}, status
    assert "outbox-relay run" in containers.exec(name, "cat", "/proc/1/cmdline").stdout.replace("\0", " ")


def test_size_and_start_up_against_the_base(
    engine: Engine, base: Base, image: str, containers: Containers, relay_database: str, amqp_url: str
) -> None:
    size, base_size = engine.size(image), engine.size(base.image)
    added = (size - base_size) / 1e6
    started = time.monotonic()
    done = engine("run", "--rm", "--network", "host", base.image, "python", "-c", "pass")
    python_start = time.monotonic() - started
    assert done.returncode == 0
    assert containers.run("migrate", env={"RELAY_DATABASE_URL": relay_database}).returncode == 0
    port = free_port()
    started = time.monotonic()
    containers.start(
        env={"RELAY_DATABASE_URL": relay_database, "RELAY_SINK": amqp_url,
             "RELAY_METRICS_PORT": str(port)},
    )  # fmt: skip
    # The health check's grace: a relay slower to start would be marked unhealthy, and restarted.
    start_period = engine.declared_health_check(image)["StartPeriod"] / 1e9
    wait_for_healthz(port, timeout=start_period - (time.monotonic() - started))
    relay_start = time.monotonic() - started
    FIGURES.append(
        f"image {size / 1e6:.0f} MB: base {base_size / 1e6:.0f} MB + relay {added:.0f} MB; "
        f"start to /healthz 200 {relay_start:.2f} s (base `python -c pass` {python_start:.2f} s)"
    )
    assert added < MAX_ADDED_MEGABYTES, f"the relay adds {added:.0f} MB to its base"
