"""The container engine the container tests drive, and the images they make with it.

``CONTAINER_ENGINE`` picks ``podman`` or ``docker`` (by default podman where it is
installed, else docker). The relay image is built from the repository's own
``Dockerfile``. Its base image (the first ``FROM``) is used as the engine has it;
an engine without it pulls it, and where that fails too (no registry reachable,
as on the project's machines) a stand-in is made from Debian's packages
(``standin-base.sh``: root and debootstrap) and kept in the engine, labelled with
a hash of its recipe, so that later runs reuse it until the recipe changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
RECIPE = Path(__file__).with_name("standin-base.sh")
ENGINE_VARIABLE = "CONTAINER_ENGINE"
ENGINES = ("podman", "docker")
#: Marks a stand-in base; its value is the hash of the recipe that made it.
STANDIN_LABEL = "org.outbox-relay.standin-recipe"
#: The cached stand-in's own name, beside the base's: one per recipe.
STANDIN_REPOSITORY = "localhost/outbox-relay-standin-base"
#: Steps that fetch from the network (debootstrap, pip in the build, a pull) get this long.
FETCH_TIMEOUT_SECONDS = 900.0
COMMAND_TIMEOUT_SECONDS = 120.0

# The project's machines run Podman on cgroup v1 without systemd: crun refuses that
# layout and runc refuses the default open-files limit, so without a configuration of
# the user's own (CONTAINERS_CONF) the tests use runc, cgroupfs and the caller's limits.
PODMAN_CONF = """\
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
"""

HOW_TO_GET = {
    "podman": "apt-get install -y podman runc debootstrap (as root), or CONTAINER_ENGINE=docker with Docker running",
    "docker": "start the Docker engine, or install Podman: apt-get install -y podman runc debootstrap (as root)",
}


class EngineMissing(RuntimeError):
    """The engine, or a tool the stand-in base needs, is not there; the message says how to get it."""


def cache_dir() -> Path:
    """Where the tests keep what outlives a run (outside the clone): ``~/.cache/outbox-relay``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "outbox-relay"


def base_image() -> str:
    """The image the Dockerfile's first stage starts from."""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        words = line.split()
        if words and words[0].upper() == "FROM":
            return words[1]
    raise AssertionError(f"{DOCKERFILE} has no FROM")


def qualified(image: str) -> str:
    """``python:3.11`` -> ``docker.io/library/python:3.11``: what a pull of a short name asks for."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if "/" in image else f"docker.io/library/{image}"


def recipe_hash() -> str:
    """What the stand-in base is keyed by: its recipe's text."""
    return hashlib.sha256(RECIPE.read_bytes()).hexdigest()[:16]


@dataclass
class Engine:
    """One container engine's command line, with the environment it runs under."""

    name: str
    program: str
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_environment(cls) -> Engine:
        """The engine ``CONTAINER_ENGINE`` names, else podman or docker, whichever is installed."""
        wanted = os.environ.get(ENGINE_VARIABLE, "").strip()
        if wanted and wanted not in ENGINES:
            raise EngineMissing(f"{ENGINE_VARIABLE}={wanted!r}: use one of {', '.join(ENGINES)}")
        candidates = [wanted] if wanted else [name for name in ENGINES if shutil.which(name)] or ["podman"]
        name = candidates[0]
        program = shutil.which(name)
        if program is None:
            raise EngineMissing(f"{name} is not installed: {HOW_TO_GET[name]}")
        engine = cls(name, program, dict(os.environ))
        if name == "podman":
            engine.env.setdefault("CONTAINERS_CONF", str(_podman_conf()))
        return engine

    def __call__(
        self, *args: str, timeout: float = COMMAND_TIMEOUT_SECONDS, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``ENGINE ARGS``; with ``check``, a non-zero exit fails with the engine's own words."""
        done = subprocess.run(
            [self.program, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"`{self.name} {' '.join(args)}` exited {done.returncode}: {done.stderr.strip()}")
        return done

    def image_exists(self, image: str) -> bool:
        """Whether the engine holds ``image``."""
        return self("image", "inspect", image, check=False).returncode == 0

    def inspect(self, what: str, *, image: bool = False) -> dict[str, Any]:
        """``inspect`` of one container (or image) as a dict."""
        found = json.loads(self("image" if image else "container", "inspect", what).stdout)
        assert isinstance(found, list) and len(found) == 1, found
        result: dict[str, Any] = found[0]
        return result

    def labels(self, image: str) -> dict[str, str]:
        """An image's labels (none: empty)."""
        return dict(self.inspect(image, image=True).get("Config", {}).get("Labels") or {})

    def declared_health_check(self, image: str) -> dict[str, Any]:
        """The image's HEALTHCHECK (``Test``, and ``Interval``, ``StartPeriod``... in nanoseconds)."""
        found = self.inspect(image, image=True)
        # Docker keeps it in the image's config; Podman beside it.
        check = found.get("Config", {}).get("Healthcheck") or found.get("Healthcheck")
        assert check and check.get("Test"), f"{image} declares no health check"
        return dict(check)

    def size(self, image: str) -> int:
        """An image's size in bytes, as the engine reports it."""
        return int(self.inspect(image, image=True)["Size"])

    def build(self, tag: str) -> None:
        """Build the repository's Dockerfile (its last stage, the relay) as ``tag``."""
        args = ["build", "-t", tag, "-f", str(DOCKERFILE)]
        if self.name == "podman":
            # Docker's image format keeps HEALTHCHECK (Podman's default, OCI, drops it); host
            # networking reaches the package index wherever the host does; no intermediate
            # images are kept, so repeated runs leave nothing behind.
            args += ["--format", "docker", "--network", "host", "--layers=false"]
        self(*args, str(ROOT), timeout=FETCH_TIMEOUT_SECONDS)

    def health_check(self, container: str) -> subprocess.CompletedProcess[str]:
        """Run the image's declared health check once in ``container``, as the engine runs it."""
        if self.name == "podman":
            return self("healthcheck", "run", container, check=False)
        # Docker runs it only on its interval: run the declared test the same way, in the container.
        test = self.declared_health_check(self.inspect(container)["Image"])["Test"]
        kind, words = test[0], test[1:]
        command = ["/bin/sh", "-c", words[0]] if kind == "CMD-SHELL" else words
        return self("exec", container, *command, check=False)

    def remove(self, container: str) -> None:
        """Remove a container, killed at once if it still runs (a test's leftovers need no grace)."""
        # Docker's rm -f kills at once; Podman's first waits 10 s for a process that ignores SIGTERM.
        self("rm", "-f", *(["-t", "0"] if self.name == "podman" else []), container, check=False)

    def top(self, container: str) -> str:
        """The container's processes with their user and command line, as the engine shows them."""
        if self.name == "podman":
            return self("top", container, "user", "group", "pid", "args").stdout
        return self("top", container, "-o", "user,group,pid,args").stdout


def _podman_conf() -> Path:
    conf = PODMAN_CONF + ('runtime = "runc"\n' if shutil.which("runc") else "")
    path = cache_dir() / "containers.conf"
    if not path.is_file() or path.read_text(encoding="utf-8") != conf:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(conf, encoding="utf-8")
    return path


@dataclass(frozen=True)
class Base:
    """The base image the relay image was built on, and where it came from."""

    image: str
    origin: str  # "engine" (there already), "pulled", "stand-in (cached)" or "stand-in (built)"


def ensure_base(engine: Engine) -> Base:
    """Make sure the engine holds the Dockerfile's base image, pulling it or making the stand-in."""
    image = base_image()
    wanted = recipe_hash()
    if engine.image_exists(image):
        made_by = engine.labels(image).get(STANDIN_LABEL)
        if made_by is None:
            return Base(image, "engine")
        if made_by == wanted:
            return Base(image, "stand-in (cached)")
    elif engine(
        "pull", qualified(image), timeout=FETCH_TIMEOUT_SECONDS, check=False
    ).returncode == 0 and engine.image_exists(image):
        return Base(image, "pulled")
    standin = f"{STANDIN_REPOSITORY}:{wanted}"
    origin = "stand-in (cached)"
    if not engine.image_exists(standin):
        _make_standin(engine, standin, wanted)
        origin = "stand-in (built)"
    # Under the name a pull would give it (Podman would otherwise file a short name under localhost/).
    engine("tag", standin, qualified(image))
    return Base(image, origin)


def _make_standin(engine: Engine, standin: str, wanted: str) -> None:
    missing = [tool for tool in ("debootstrap", "chroot", "tar") if shutil.which(tool) is None]
    if missing:
        raise EngineMissing(
            f"{engine.name} has no {base_image()} and cannot pull it; the stand-in base needs "
            f"{', '.join(missing)}: apt-get install -y debootstrap (as root)"
        )
    if os.geteuid() != 0:
        raise EngineMissing(
            f"{engine.name} has no {base_image()} and cannot pull it; the stand-in base is made with "
            "debootstrap, as root: run `make container-test` as root once, or pull the image"
        )
    done = subprocess.run(
        ["bash", str(RECIPE), engine.program, standin, f"{STANDIN_LABEL}={wanted}"],
        env=engine.env,
        capture_output=True,
        text=True,
        timeout=FETCH_TIMEOUT_SECONDS,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise AssertionError(f"making the stand-in base failed (exit {done.returncode}):\n{tail}")


def image_tag() -> str:
    """This run's relay image: one per process, so that runs side by side do not share it."""
    return f"localhost/outbox-relay-test:{os.getpid()}"


def numeric_user(user: str) -> tuple[int, int] | None:
    """``USER 10001:10001`` -> (10001, 10001); None unless both parts are numbers."""
    match = re.fullmatch(r"(\d+):(\d+)", user)
    return (int(match.group(1)), int(match.group(2))) if match else None


def preflight() -> str | None:
    """What stops the container tests before they start (no engine; no base image and no way to
    make the stand-in), as a message saying how to get it; None when nothing does."""
    try:
        engine = Engine.from_environment()
    except EngineMissing as exc:
        return str(exc)
    if engine("info", check=False, timeout=60).returncode != 0:
        return f"`{engine.name} info` fails: {HOW_TO_GET[engine.name]}"
    if engine.image_exists(base_image()) or shutil.which("debootstrap"):
        return None
    return (
        f"{engine.name} has no {base_image()}: pull it, or let the tests make a stand-in from Debian's "
        "packages: apt-get install -y debootstrap (as root)"
    )


if __name__ == "__main__":
    import sys

    problem = preflight()
    if problem:
        print(f"container-test: {problem}", file=sys.stderr)
    sys.exit(1 if problem else 0)
