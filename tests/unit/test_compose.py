"""The compose stack and the Dockerfile, checked without a Docker engine.

Nothing here starts a container (``make container-test`` builds and runs the
image). The files are parsed, held against the Compose Specification's keys and
values, and held against the command line: every ``RELAY_*`` variable must be
one that the command its service runs reads (as the parser's help names them),
and the command line with its environment must be accepted by the real parser;
a relay that runs must restart after an error, get a stop grace period longer
than its publish timeout, and have a health check the image can run on the port
it serves. The same for the example shop and consumer and their ``SHOP_*`` and
``CONSUMER_*`` variables. And the files are held against each other (images and
the Dockerfile stages they build, dependencies, health checks, ports, the Kafka
listeners). Each kind of mistake in a relay service is made once on a copy of
the file, to show that the checks catch it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import fnmatch
import functools
import importlib
import importlib.util
import io
import json
import os
import re
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from examples import services as examples
from examples.shop import TOPIC
from relay.cli import build_parser, reject_bad_env
from relay.config import AmqpSinkConfig, KafkaSinkConfig, TableName, check_database_url, parse_sink_url
from relay.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = ROOT / "pyproject.toml"

PROG = "outbox-relay"
#: How a flag's help names the variable it falls back to.
ENV_IN_HELP = re.compile(r"\[env (RELAY_[A-Z0-9_]+)\]")

# What the Compose Specification (compose-spec's spec.md) knows:
# a key outside these is refused by `docker compose config`, or ignored by older tools.
TOP_LEVEL_KEYS = frozenset({"version", "name", "include", "services", "networks", "volumes", "configs", "secrets"})
SERVICE_KEYS = frozenset({
    "annotations", "attach", "blkio_config", "build", "cap_add", "cap_drop", "cgroup", "cgroup_parent", "command",
    "configs", "container_name", "cpu_count", "cpu_percent", "cpu_period", "cpu_quota", "cpu_rt_period",
    "cpu_rt_runtime", "cpu_shares", "cpus", "cpuset", "credential_spec", "depends_on", "deploy", "develop",
    "device_cgroup_rules", "devices", "dns", "dns_opt", "dns_search", "domainname", "driver_opts", "entrypoint",
    "env_file", "environment", "expose", "extends", "external_links", "extra_hosts", "gpus", "group_add",
    "healthcheck", "hostname", "image", "init", "ipc", "isolation", "label_file", "labels", "links", "logging",
    "mac_address", "mem_limit", "mem_reservation", "mem_swappiness", "memswap_limit", "models", "network_mode",
    "networks", "oom_kill_disable", "oom_score_adj", "pid", "pids_limit", "platform", "ports", "post_start",
    "pre_stop", "privileged", "profiles", "provider", "pull_policy", "read_only", "restart", "runtime", "scale",
    "secrets", "security_opt", "shm_size", "stdin_open", "stop_grace_period", "stop_signal", "storage_opt",
    "sysctls", "tmpfs", "tty", "ulimits", "use_api_socket", "user", "userns_mode", "uts", "volumes",
    "volumes_from", "working_dir",
})  # fmt: skip
HEALTHCHECK_KEYS = frozenset({"test", "interval", "timeout", "retries", "start_period", "start_interval", "disable"})
RESTART_POLICIES = frozenset({"no", "always", "on-failure", "unless-stopped"})
DEPENDENCY_CONDITIONS = frozenset({"service_started", "service_healthy", "service_completed_successfully"})
DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)")
DURATION = re.compile(rf"(?:{DURATION_PART.pattern})+")
#: Compose's defaults where a service sets none.
DEFAULT_STOP_GRACE = "10s"
DEFAULT_HEALTHCHECK_TIMEOUT = "30s"
#: The restart policies that bring back a relay that exited on an error (a lost database).
RELAY_RESTARTS = frozenset({"always", "unless-stopped", "on-failure"})
EXPECTED_SERVICES = frozenset(
    {"postgres", "kafka", "rabbitmq", "migrate", "relay", "relay-rabbitmq", "shop", "consumer"}
)
ONE_SHOT_COMMANDS = frozenset({"migrate"})
#: The entry point of the example services, which run the Dockerfile's examples stage.
EXAMPLES_ENTRYPOINT = ["python", "-m", examples.__name__]
EXAMPLES_STAGE = "examples"
#: What the relay image may hold besides the packages the project installs.
RELAY_IMAGE_FILES = frozenset({"pyproject.toml", "README.md"})
#: A heartbeat older than this makes a container unhealthy; its services beat at least once a second.
HEARTBEAT_MAX_AGE_SECONDS = 60


# -- helpers -------------------------------------------------------------------


def load_compose() -> dict[str, Any]:
    """The compose file as plain data (a copy of its own for each caller to change)."""
    return copy.deepcopy(_compose_data())


@functools.cache
def _compose_data() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{COMPOSE_FILE} is not a YAML mapping"
    return data


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    """The ``services`` section, each service a mapping."""
    found = load_compose().get("services")
    assert isinstance(found, dict) and found, "compose file has no services"
    for name, service in found.items():
        assert isinstance(service, dict), f"service {name!r} is not a mapping"
    return found


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment, from either the mapping or the ``KEY=VALUE`` list form."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        pairs = (item.split("=", 1) for item in raw)
        return {key: value for key, value in pairs}
    return {str(key): "" if value is None else str(value) for key, value in raw.items()}


def dependencies(service: dict[str, Any]) -> dict[str, str]:
    """``depends_on`` as target -> condition (the short list form means ``service_started``)."""
    raw = service.get("depends_on") or {}
    if isinstance(raw, list):
        return {str(target): "service_started" for target in raw}
    return {str(target): str((spec or {}).get("condition", "service_started")) for target, spec in raw.items()}


def profiles(service: dict[str, Any]) -> set[str]:
    """The profiles a service belongs to (none: it always starts)."""
    return set(service.get("profiles") or [])


def healthcheck_test(service: dict[str, Any]) -> list[str]:
    """The health check command as a list of words, empty when there is none or it is disabled."""
    check = service.get("healthcheck") or {}
    if check.get("disable"):
        return []
    test = check.get("test") or []
    if isinstance(test, str):
        return ["CMD-SHELL", test]
    return [str(word) for word in test if str(word) != "NONE"]


def words(value: Any) -> list[str]:
    """A compose ``entrypoint`` or ``command`` as a list of words."""
    return value.split() if isinstance(value, str) else [str(word) for word in value or []]


def uses_this_image(service: dict[str, Any]) -> bool:
    """True for services that run this project's image."""
    return "build" in service or str(service.get("image", "")).startswith(PROG)


def build_target(service: dict[str, Any]) -> str | None:
    """The Dockerfile stage a service builds (None: the last one, as ``docker build`` without ``--target``)."""
    build = service.get("build")
    return build.get("target") if isinstance(build, dict) else None


def entrypoint(service: dict[str, Any]) -> list[str]:
    """What a service of this image starts: its own ``entrypoint``, else its image's."""
    if "entrypoint" in service:
        return words(service["entrypoint"])
    return dockerfile_exec_form("ENTRYPOINT", build_target(service))


def is_relay(service: dict[str, Any]) -> bool:
    """True for services that run the ``outbox-relay`` command."""
    return uses_this_image(service) and entrypoint(service) == [PROG]


def is_example(service: dict[str, Any]) -> bool:
    """True for the example shop and consumer (``python -m examples.services``)."""
    return uses_this_image(service) and entrypoint(service) == EXAMPLES_ENTRYPOINT


def relay_command(service: dict[str, Any]) -> str:
    """The subcommand a service of this image runs (the image's CMD when unset)."""
    command = service.get("command")
    if command is None:
        return dockerfile_exec_form("CMD", build_target(service))[0]
    found = words(command)
    assert found, "empty command"
    return found[0]


def example_env_names(command: str) -> set[str]:
    """The variables ``python -m examples.services COMMAND`` reads: one per flag, and DATABASE_URL."""
    return {examples.env_name(command, flag) for flag in subcommand_flags(examples.build_parser({}))[command]} | {
        "DATABASE_URL"
    }


def parsed_example(service: dict[str, Any]) -> argparse.Namespace:
    """An example service's command line as its entry point parses it from the service's environment."""
    command = relay_command(service)
    try:
        return examples.build_parser(environment(service)).parse_args([command])
    except SystemExit as exc:
        pytest.fail(f"`{' '.join(EXAMPLES_ENTRYPOINT)} {command}` rejects its environment (exit {exc.code})")


def kafka_hosts(url: str) -> set[str | None]:
    """The host names of a ``kafka://`` URL."""
    config = parse_sink_url(url)
    assert isinstance(config, KafkaSinkConfig), f"{url} is not a kafka:// URL"
    return {server.rpartition(":")[0] for server in config.bootstrap_servers.split(",")}


def heartbeat_age_limit(service: dict[str, Any], path: str) -> int | None:
    """The age in seconds past which the health check calls ``path`` stale, or None if it does not read it."""
    test = " ".join(healthcheck_test(service))
    match = re.search(rf"os\.stat\('{re.escape(path)}'\)\.st_mtime\s*>\s*(\d+)", test)
    return int(match.group(1)) if match else None


def is_one_shot(service: dict[str, Any]) -> bool:
    """A service that is meant to run to completion rather than stay up."""
    return is_relay(service) and relay_command(service) in ONE_SHOT_COMMANDS


def subcommand_flags(parser: argparse.ArgumentParser | None = None) -> dict[str, set[str]]:
    """Every long option of every subcommand, from the real parser (``outbox-relay``'s by default)."""
    parser = build_parser() if parser is None else parser
    flags: dict[str, set[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                flags[name] = {
                    option
                    for sub_action in subparser._actions
                    for option in sub_action.option_strings
                    if option.startswith("--")
                }
    assert flags, "build_parser() has no subcommands"
    return flags


@functools.cache
def env_names_for(command: str) -> frozenset[str]:
    """The ``RELAY_*`` variables ``outbox-relay COMMAND`` reads, from the real parser: each flag with
    an environment fallback names it in its help (``[env RELAY_ROUTES]`` for ``--route``), and a flag
    without one (``requeue --id``, ``--no-listen``) names none."""
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            subparser = action.choices[command]
            return frozenset(name for sub in subparser._actions for name in ENV_IN_HELP.findall(sub.help or ""))
    raise AssertionError("build_parser() has no subcommands")


@functools.cache
def _dockerfile_lines() -> tuple[tuple[str, str], ...]:
    """(INSTRUCTION, arguments) pairs of the whole file, with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = pending + stripped
        pending = ""
        keyword, _, rest = text.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    assert not pending, "Dockerfile ends in a line continuation"
    return tuple(instructions)


def dockerfile_stages() -> dict[str, list[tuple[str, str]]]:
    """Each stage's instructions from its FROM on, by name (``FROM image AS name``) or else by position."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for keyword, rest in _dockerfile_lines():
        if keyword == "FROM":
            _image, *alias = re.split(r"\s+as\s+", rest, flags=re.IGNORECASE)
            name = alias[0].strip().lower() if alias else str(len(stages))
            assert name not in stages, f"two stages are named {name!r}"
            current = stages[name] = []
        assert current is not None, f"{keyword} before the first FROM"
        current.append((keyword, rest))
    assert stages, "Dockerfile has no FROM"
    return stages


def dockerfile_instructions(target: str | None = None) -> list[tuple[str, str]]:
    """The instructions that build stage ``target`` (the last when None): its own after its parents'."""
    stages = dockerfile_stages()
    name = list(stages)[-1] if target is None else target
    assert name in stages, f"the Dockerfile has no stage {name!r} ({sorted(stages)})"
    chain: list[tuple[str, str]] = []
    while name in stages:
        chain = stages[name] + chain
        name = stages[name][0][1].split()[0].lower()
    return chain


def dockerfile_values(keyword: str, target: str | None = None) -> list[str]:
    """The arguments of every ``keyword`` instruction that builds ``target``, in order."""
    return [rest for kw, rest in dockerfile_instructions(target) if kw == keyword]


def dockerfile_exec_form(keyword: str, target: str | None = None) -> list[str]:
    """The JSON (exec) form of the last ``keyword`` instruction that builds ``target``."""
    values = dockerfile_values(keyword, target)
    assert values, f"Dockerfile has no {keyword}"
    parsed = json.loads(values[-1])
    assert isinstance(parsed, list) and all(isinstance(word, str) for word in parsed), (
        f"{keyword} is not in exec form: {values[-1]}"
    )
    return parsed


def dockerfile_env(target: str | None = None) -> dict[str, str]:
    """Variables set by ``ENV KEY=VALUE`` instructions in the image ``target`` builds."""
    env: dict[str, str] = {}
    for rest in dockerfile_values("ENV", target):
        for item in rest.split():
            key, sep, value = item.partition("=")
            assert sep, f"ENV {rest!r}: use the KEY=VALUE form"
            env[key] = value
    return env


def copied_sources(target: str | None = None) -> set[str]:
    """What the image ``target`` builds copies from the build context."""
    return {
        source
        for rest in dockerfile_values("COPY", target)
        for source in rest.split()[:-1]
        if not source.startswith("--")
    }


def installed_packages() -> set[str]:
    """The top-level packages of this repository that ``pip install`` puts in the wheel."""
    include = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {path.name for path in ROOT.iterdir() if (path / "__init__.py").is_file()}
    return {name for name in packages if any(fnmatch.fnmatch(name, pattern) for pattern in include)}


def port_pairs(service: dict[str, Any]) -> Iterator[tuple[object, object]]:
    """(published, target) for each port entry, in both compose syntaxes."""
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            yield entry.get("published"), entry.get("target")
            continue
        parts = str(entry).split("/", 1)[0].split(":")
        if len(parts) == 1:
            yield None, parts[0]
        else:
            yield parts[-2], parts[-1]


def as_port(value: object) -> int | None:
    """``value`` as a TCP port number, or None if it is not one."""
    text = str(value)
    if not text.isdigit():
        return None
    number = int(text)
    return number if 0 < number < 65536 else None


# -- the helpers themselves ----------------------------------------------------


def test_flag_mapping_knows_real_flags_and_rejects_made_up_ones() -> None:
    run = env_names_for("run")
    assert {"RELAY_BATCH_SIZE", "RELAY_METRICS_PORT", "RELAY_TABLE", "RELAY_LISTEN"} <= run
    assert "RELAY_NO_SUCH_SETTING" not in run
    assert "RELAY_METRICS_PORT" not in env_names_for("migrate")
    assert "RELAY_TABLE" in env_names_for("migrate")
    assert "RELAY_DATABASE_URL" in env_names_for("migrate") and "RELAY_SINK" not in env_names_for("migrate")
    # Variables named otherwise than their flags, and flags that read no variable.
    assert {"RELAY_ROUTES", "RELAY_FIELD_HEADERS"} <= run and not {"RELAY_ROUTE", "RELAY_NO_LISTEN"} & run
    assert "RELAY_ID" not in env_names_for("requeue") and "RELAY_JSON" in env_names_for("requeue")


# -- compose -------------------------------------------------------------------


def test_compose_has_the_stack(services: dict[str, dict[str, Any]]) -> None:
    missing = EXPECTED_SERVICES - services.keys()
    assert not missing, f"compose file lacks services {sorted(missing)}"
    assert profiles(services["rabbitmq"]) == {"rabbitmq"}
    assert profiles(services["relay-rabbitmq"]) == {"rabbitmq"}
    assert not profiles(services["relay"]), "the Kafka relay should start without a profile"


def test_every_image_is_pinned_and_every_build_exists(services: dict[str, dict[str, Any]]) -> None:
    problems = []
    for name, service in services.items():
        if "build" not in service and "image" not in service:
            problems.append(f"{name}: neither image nor build")
        build = service.get("build")
        if build is not None:
            context = build if isinstance(build, str) else build.get("context", ".")
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
            context_dir = (COMPOSE_DIR / context).resolve()
            if not context_dir.is_dir():
                problems.append(f"{name}: build context {context} does not exist")
            elif not (context_dir / dockerfile).is_file():
                problems.append(f"{name}: no {dockerfile} in {context_dir}")
            elif context_dir == ROOT and dockerfile == DOCKERFILE.name:
                target = build_target(service)
                if target is not None and target not in dockerfile_stages():
                    problems.append(f"{name}: builds stage {target!r}, which the Dockerfile lacks")
        image = service.get("image")
        if image is not None:
            repository, sep, tag = str(image).rpartition(":")
            if not sep or "/" in tag or not repository:
                problems.append(f"{name}: image {image!r} has no tag")
            elif tag == "latest":
                problems.append(f"{name}: image {image!r} is not pinned")
    assert not problems, "\n".join(problems)


def test_relay_services_build_this_repository(services: dict[str, dict[str, Any]]) -> None:
    relays = [name for name, service in services.items() if is_relay(service)]
    assert {"migrate", "relay", "relay-rabbitmq"} <= set(relays)
    ours = [name for name, service in services.items() if uses_this_image(service)]
    for name in ours:
        assert is_relay(services[name]) or is_example(services[name]), (
            f"{name}: runs {entrypoint(services[name])}, neither {PROG} nor {' '.join(EXAMPLES_ENTRYPOINT)}"
        )
    for name in ours:
        build = services[name].get("build")
        assert build is not None, f"{name}: runs the relay image but does not build it"
        context = build if isinstance(build, str) else build["context"]
        assert (COMPOSE_DIR / context).resolve() == ROOT, f"{name}: builds {context}, not the repository root"


def test_services_that_share_an_image_tag_build_the_same_stage(services: dict[str, dict[str, Any]]) -> None:
    stages_by_image: dict[str, set[str | None]] = {}
    for service in services.values():
        if "build" in service and "image" in service:
            stages_by_image.setdefault(str(service["image"]), set()).add(build_target(service) or "(last)")
    shared = {image: stages for image, stages in stages_by_image.items() if len(stages) > 1}
    assert not shared, f"one tag for different stages: whichever is built last wins it: {shared}"


def test_relays_run_the_relay_stage_and_examples_the_examples_stage(services: dict[str, dict[str, Any]]) -> None:
    relay_stage = list(dockerfile_stages())[-1]
    for name, service in services.items():
        if is_relay(service):
            assert build_target(service) in (None, relay_stage), f"{name}: builds {build_target(service)!r}"
        elif is_example(service):
            assert build_target(service) == EXAMPLES_STAGE, f"{name}: builds {build_target(service)!r}"
            # Spelled out in compose, and the image's own: `docker run IMAGE shop` does the same.
            assert dockerfile_exec_form("ENTRYPOINT", EXAMPLES_STAGE) == EXAMPLES_ENTRYPOINT


def relay_command_line(service: dict[str, Any]) -> list[str]:
    """The words a relay service gives ``outbox-relay``: its ``command``, else the image's CMD."""
    command = service.get("command")
    return words(command) if command is not None else dockerfile_exec_form("CMD", build_target(service))


@contextlib.contextmanager
def relay_environment(variables: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``variables`` as the only ``RELAY_*`` settings (and no ``DATABASE_URL``)."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith("RELAY_") or name == "DATABASE_URL":
            del os.environ[name]
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def parsed_relay(name: str, service: dict[str, Any]) -> tuple[argparse.Namespace | None, list[str]]:
    """A relay service's command line as ``outbox-relay`` parses it in the service's environment (the
    image's ``ENV`` under the service's own): the arguments, or the CLI's one-line refusal."""
    line = tuple(relay_command_line(service))
    env = {**dockerfile_env(build_target(service)), **environment(service)}
    args, refusal = _parse_relay(line, tuple(sorted(env.items())))
    return args, [f"{name}: `{PROG} {' '.join(line)}` refuses it: {refusal}"] if refusal else []


@functools.cache
def _parse_relay(line: tuple[str, ...], env: tuple[tuple[str, str], ...]) -> tuple[argparse.Namespace | None, str]:
    said = io.StringIO()
    with relay_environment(dict(env)):
        try:
            with contextlib.redirect_stderr(said):
                args = build_parser().parse_args(line)
                reject_bad_env(args)
        except SystemExit as exc:
            return None, f"(exit {exc.code}) {said.getvalue().strip()}"
    return args, ""


def compose_duration(value: object) -> float | None:
    """Seconds in a compose duration (``45s``, ``1m30s``, ``500ms``), or None if it is not one."""
    text = str(value)
    if not DURATION.fullmatch(text):
        return None
    return sum(float(number) * DURATION_UNITS[unit] for number, unit in DURATION_PART.findall(text))


def compose_key_problems(data: dict[str, Any]) -> list[str]:
    """Keys and values the Compose Specification does not know (what ``docker compose config`` refuses
    or silently ignores): top-level and service keys, health check settings, restart policies,
    durations, dependency conditions."""
    problems = [
        f"unknown top-level key {key!r}" for key in data if key not in TOP_LEVEL_KEYS and not key.startswith("x-")
    ]
    for name, service in (data.get("services") or {}).items():
        problems += [
            f"{name}: unknown key {key!r}" for key in service if key not in SERVICE_KEYS and not key.startswith("x-")
        ]
        check = service.get("healthcheck") or {}
        problems += [f"{name}: unknown health check key {key!r}" for key in check if key not in HEALTHCHECK_KEYS]
        for key in ("interval", "timeout", "start_period", "start_interval"):
            if key in check and compose_duration(check[key]) is None:
                problems.append(f"{name}: health check {key} {check[key]!r} is not a duration")
        if "retries" in check and not isinstance(check["retries"], int):
            problems.append(f"{name}: health check retries {check['retries']!r} is not a number")
        restart = str(service.get("restart", "no"))
        if restart not in RESTART_POLICIES and not re.fullmatch(r"on-failure:\d+", restart):
            problems.append(f"{name}: restart {restart!r} is none of {sorted(RESTART_POLICIES)}")
        if "stop_grace_period" in service and compose_duration(service["stop_grace_period"]) is None:
            problems.append(f"{name}: stop_grace_period {service['stop_grace_period']!r} is not a duration")
        for target, condition in dependencies(service).items():
            if condition not in DEPENDENCY_CONDITIONS:
                problems.append(f"{name}: unknown condition {condition!r} on {target!r}")
    return problems


def relay_env_problems(services: dict[str, dict[str, Any]]) -> list[str]:
    """``RELAY_*`` variables that the command a relay service runs does not read."""
    commands = subcommand_flags()
    problems = []
    for name, service in services.items():
        if not is_relay(service):
            continue
        command = relay_command(service)
        if command not in commands:
            problems.append(f"{name}: {command!r} is not an {PROG} command ({sorted(commands)})")
            continue
        known = env_names_for(command)
        for variable in environment(service):
            if variable.startswith("RELAY_") and variable not in known:
                problems.append(f"{name}: {variable} is not read by `{PROG} {command}`")
        if "RELAY_DATABASE_URL" not in environment(service):
            problems.append(f"{name}: no RELAY_DATABASE_URL")
    return problems


def relay_cli_problems(services: dict[str, dict[str, Any]]) -> list[str]:
    """Relay services whose command line and environment the CLI refuses (an unknown flag, a bad
    value), or whose URLs and table it would refuse when it starts."""
    problems = []
    for name, service in services.items():
        if not is_relay(service):
            continue
        args, refused = parsed_relay(name, service)
        problems += refused
        if args is None:
            continue
        try:
            check_database_url(args.database_url or "")
            TableName.parse(args.table)
            if args.command == "run":
                parse_sink_url(args.sink or "")
        except ConfigError as exc:
            problems.append(f"{name}: {exc}")
        if args.command == "run" and args.metrics_port is None:
            problems.append(f"{name}: no metrics port, so nothing answers the health check")
        elif args.command == "run" and args.metrics_host != "0.0.0.0":
            problems.append(f"{name}: metrics only on loopback in a container")
    return problems


def relay_run_problems(services: dict[str, dict[str, Any]]) -> list[str]:
    """Relays that run, against what the image and the CLI need: a restart policy that brings back a
    relay that stopped on an error, a stop grace period longer than the publish timeout (SIGTERM
    lets the batches in hand settle), and a health check the image can run, on the port the relay
    serves, with time to answer."""
    problems = []
    for name, service in services.items():
        if not is_relay(service) or relay_command(service) != "run":
            continue
        args, _ = parsed_relay(name, service)
        if args is None:
            continue  # relay_cli_problems says why
        restart = str(service.get("restart", "no"))
        if restart not in RELAY_RESTARTS and not restart.startswith("on-failure:"):
            problems.append(f"{name}: restart {restart!r}: a relay that exits on an error would stay down")
        grace = compose_duration(service.get("stop_grace_period", DEFAULT_STOP_GRACE))
        if grace is not None and grace <= args.publish_timeout:
            problems.append(
                f"{name}: stop_grace_period {grace:g} s is not longer than --publish-timeout {args.publish_timeout:g} s"
            )
        problems += relay_health_check_problems(name, service, args.metrics_port)
    return problems


def relay_health_check_problems(name: str, service: dict[str, Any], port: int | None) -> list[str]:
    """A relay's health check: run by a program the image has, probing its own /healthz, in time."""
    test = healthcheck_test(service)
    if not test:
        return [f"{name}: no health check"]
    problems = []
    program = (test[1:] if test[0] == "CMD" else " ".join(test[1:]).split())[:1]
    if program not in (["python"], ["python3"]):
        problems.append(f"{name}: the health check runs {program}, but the image has python, not curl or wget")
    if f"127.0.0.1:{port}/healthz" not in " ".join(test):
        problems.append(f"{name}: the health check does not probe /healthz on the metrics port {port}")
    probe = re.search(r"timeout=(\d+(?:\.\d+)?)", " ".join(test))
    allowed = compose_duration((service.get("healthcheck") or {}).get("timeout", DEFAULT_HEALTHCHECK_TIMEOUT))
    if probe is None:
        problems.append(f"{name}: the health check's request has no timeout of its own")
    elif allowed is not None and float(probe.group(1)) >= allowed:
        problems.append(f"{name}: the health check timeout {allowed:g} s cuts its request's {probe.group(1)} s")
    return problems


def test_compose_file_holds_only_what_compose_knows() -> None:
    assert compose_key_problems(load_compose()) == []


def test_relay_env_vars_are_read_by_the_command_run(services: dict[str, dict[str, Any]]) -> None:
    assert relay_env_problems(services) == []


def test_relay_command_lines_and_env_values_are_accepted_by_the_cli(services: dict[str, dict[str, Any]]) -> None:
    assert relay_cli_problems(services) == []


def test_relays_restart_drain_and_are_checked_as_the_image_allows(services: dict[str, dict[str, Any]]) -> None:
    assert relay_run_problems(services) == []


def _set(service: str, *path: str, value: object) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        node = data["services"][service]
        for key in path[:-1]:
            node = node[key]
        if value is None:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return change


def _rename(service: str, old: str, new: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["services"][service][new] = data["services"][service].pop(old)

    return change


def _failure(test: Callable[[dict[str, dict[str, Any]]], None], services: dict[str, dict[str, Any]]) -> list[str]:
    try:
        test(services)
    except (AssertionError, ConfigError, pytest.fail.Exception) as exc:
        return [str(exc)]
    return []


#: Mistakes in the relay services, each with what the checks must say about it.
MISTAKES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "unknown variable": (_set("relay", "environment", "RELAY_NO_SUCH_SETTING", value="1"), "RELAY_NO_SUCH_SETTING"),
    "variable of another command": (_set("migrate", "environment", "RELAY_BATCH_SIZE", value="10"), "RELAY_BATCH_SIZE"),
    "variable named after its flag": (
        _set("relay", "environment", "RELAY_ROUTE", value="orders.*=kafka://kafka:9092"),
        "RELAY_ROUTE is not read",
    ),
    "variable of a flag without one": (_set("relay", "environment", "RELAY_NO_LISTEN", value="1"), "RELAY_NO_LISTEN"),
    "unknown variable on the RabbitMQ relay": (
        _set("relay-rabbitmq", "environment", "RELAY_EXCHANGE", value="orders"),
        "RELAY_EXCHANGE",
    ),
    "unknown flag": (_set("relay", "command", value=["run", "--no-such-flag"]), "--no-such-flag"),
    "flag of another command": (_set("migrate", "command", value=["migrate", "--batch-size", "10"]), "--batch-size"),
    "refused flag value": (_set("relay", "command", value=["run", "--batch-size", "0"]), "--batch-size"),
    "refused variable value": (
        _set("relay", "environment", "RELAY_METRICS_PORT", value="ninety"),
        "RELAY_METRICS_PORT",
    ),
    "unknown sink scheme": (_set("relay", "environment", "RELAY_SINK", value="kafak://kafka:9092"), "kafak"),
    "metrics on loopback only": (_set("relay", "environment", "RELAY_METRICS_HOST", value="127.0.0.1"), "loopback"),
    "relay not restarted": (_set("relay", "restart", value="no"), "would stay down"),
    "misspelt restart policy": (_set("relay", "restart", value="unless_stopped"), "'unless_stopped'"),
    "grace shorter than the publish timeout": (_set("relay", "stop_grace_period", value="20s"), "stop_grace_period"),
    "compose's default grace": (_set("relay", "stop_grace_period", value=None), "stop_grace_period 10 s"),
    "publish timeout past the grace": (
        _set("relay", "environment", "RELAY_PUBLISH_TIMEOUT", value="60"),
        "--publish-timeout 60",
    ),
    "grace not a duration": (_set("relay", "stop_grace_period", value="45 seconds"), "not a duration"),
    "health check on another port": (
        _set(
            "relay",
            "healthcheck",
            "test",
            value=[
                "CMD",
                "python",
                "-c",
                "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9200/healthz', timeout=4)",
            ],
        ),
        "/healthz on the metrics port 9100",
    ),
    "health check with curl": (
        _set("relay", "healthcheck", "test", value=["CMD", "curl", "-f", "http://127.0.0.1:9100/healthz"]),
        "curl",
    ),
    "health check timeout shorter than its request": (_set("relay", "healthcheck", "timeout", value="3s"), "cuts"),
    "misspelt key": (_rename("relay", "healthcheck", "healthchek"), "'healthchek'"),
    "misspelt key of the other relay": (_rename("relay-rabbitmq", "stop_grace_period", "stop_grace"), "'stop_grace'"),
    "misspelt health check key": (_set("relay", "healthcheck", "start_perod", value="60s"), "'start_perod'"),
    "does not wait for the migration": (
        _set("relay", "depends_on", "migrate", "condition", value="service_started"),
        "migrate",
    ),
    "does not wait for Kafka": (_set("relay", "depends_on", "kafka", value=None), "'kafka'"),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_the_relay_checks_catch_each_kind_of_mistake(mistake: str) -> None:
    change, expected = MISTAKES[mistake]
    data = load_compose()
    change(data)
    services = data["services"]
    said = [
        *compose_key_problems(data),
        *relay_env_problems(services),
        *relay_cli_problems(services),
        *relay_run_problems(services),
        *_failure(test_relays_reach_servers_they_wait_for, services),
        *_failure(test_runs_wait_for_their_migration, services),
    ]
    assert any(expected in problem for problem in said), said


def test_relays_publish_and_probe_their_metrics_port(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if not is_relay(service) or relay_command(service) != "run":
            continue
        port = as_port({**dockerfile_env(build_target(service)), **environment(service)}.get("RELAY_METRICS_PORT"))
        assert port is not None, f"{name}: RELAY_METRICS_PORT is not a port"
        targets = [as_port(target) for _, target in port_pairs(service)]
        assert port in targets, f"{name}: metrics port {port} is not published ({targets})"


def test_relays_reach_servers_they_wait_for(services: dict[str, dict[str, Any]]) -> None:
    problems = []
    for name, service in services.items():
        if not is_relay(service):
            continue
        env = environment(service)
        hosts = {urlsplit(env["RELAY_DATABASE_URL"]).hostname}
        if relay_command(service) == "run":
            sink = parse_sink_url(env["RELAY_SINK"])
            if isinstance(sink, KafkaSinkConfig):
                hosts |= {server.rpartition(":")[0] for server in sink.bootstrap_servers.split(",")}
            elif isinstance(sink, AmqpSinkConfig):
                hosts.add(urlsplit(sink.url).hostname)
        problems += unwaited_hosts(name, service, hosts, services)
    assert not problems, "\n".join(problems)


def unwaited_hosts(
    name: str, service: dict[str, Any], hosts: set[str | None], services: dict[str, dict[str, Any]]
) -> list[str]:
    """What is wrong with ``service`` connecting to ``hosts``: not a service, or not waited for."""
    waits_for = {target for target, cond in dependencies(service).items() if cond == "service_healthy"}
    problems = []
    for host in hosts:
        if host not in services:
            problems.append(f"{name}: connects to {host!r}, which is not a service")
        elif host not in waits_for:
            problems.append(f"{name}: connects to {host!r} without waiting for it to be healthy")
    return problems


def test_runs_wait_for_their_migration(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if not is_relay(service) or relay_command(service) != "run":
            continue
        env = environment(service)
        migrations = [
            target
            for target, condition in dependencies(service).items()
            if condition == "service_completed_successfully"
            and is_relay(services[target])
            and relay_command(services[target]) == "migrate"
        ]
        assert migrations, f"{name}: does not wait for a migrate service"
        table = env.get("RELAY_TABLE", "outbox")
        migrated = {environment(services[target]).get("RELAY_TABLE", "outbox") for target in migrations}
        assert table in migrated, f"{name}: relays table {table!r} but waits for migrations of {migrated}"


def test_relays_with_different_sinks_use_different_tables(services: dict[str, dict[str, Any]]) -> None:
    sinks_by_table: dict[str, set[str]] = {}
    for service in services.values():
        if is_relay(service) and relay_command(service) == "run":
            env = environment(service)
            scheme = env["RELAY_SINK"].split("://", 1)[0]
            sinks_by_table.setdefault(env.get("RELAY_TABLE", "outbox"), set()).add(scheme)
    shared = {table: sinks for table, sinks in sinks_by_table.items() if len(sinks) > 1}
    assert not shared, f"one table relayed to several brokers would split its events: {shared}"


def test_depends_on_conditions_can_be_met(services: dict[str, dict[str, Any]]) -> None:
    problems = []
    for name, service in services.items():
        for target, condition in dependencies(service).items():
            if target not in services:
                problems.append(f"{name}: depends on unknown service {target!r}")
                continue
            other = services[target]
            if profiles(other) and not profiles(other) & profiles(service):
                problems.append(f"{name}: depends on {target!r}, which only starts with {profiles(other)}")
            if condition == "service_healthy" and not healthcheck_test(other):
                problems.append(f"{name}: waits for {target!r} to be healthy, but it has no health check")
            elif condition == "service_completed_successfully" and not is_one_shot(other):
                problems.append(f"{name}: waits for {target!r} to complete, but it does not run to completion")
            elif condition not in {"service_healthy", "service_completed_successfully", "service_started"}:
                problems.append(f"{name}: unknown condition {condition!r} on {target!r}")
    assert not problems, "\n".join(problems)


def test_every_server_has_a_health_check_and_one_shots_do_not_restart(
    services: dict[str, dict[str, Any]],
) -> None:
    problems = []
    for name, service in services.items():
        if is_one_shot(service):
            if service.get("restart", "no") != "no":
                problems.append(f"{name}: a one-shot service must not restart")
        elif not healthcheck_test(service):
            problems.append(f"{name}: no health check")
        elif healthcheck_test(service)[0] not in {"CMD", "CMD-SHELL"}:
            problems.append(f"{name}: health check test must start with CMD or CMD-SHELL")
    assert not problems, "\n".join(problems)


def test_ports_are_numbers_and_host_ports_do_not_collide(services: dict[str, dict[str, Any]]) -> None:
    problems = []
    published: dict[int, str] = {}
    for name, service in services.items():
        for host, target in port_pairs(service):
            if as_port(target) is None:
                problems.append(f"{name}: container port {target!r} is not a port number")
            if host is None:
                continue
            host_port = as_port(host)
            if host_port is None:
                problems.append(f"{name}: host port {host!r} is not a port number")
            elif host_port in published:
                problems.append(f"{name}: host port {host_port} is also published by {published[host_port]}")
            else:
                published[host_port] = name
    assert published, "no service publishes a port"
    assert not problems, "\n".join(problems)


def test_kafka_is_one_kraft_node_reachable_at_kafka_9092(services: dict[str, dict[str, Any]]) -> None:
    kafka = services["kafka"]
    assert str(kafka["image"]).startswith("apache/kafka:")
    env = environment(kafka)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node_id = env["KAFKA_NODE_ID"]
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert voters == [f"{node_id}@kafka:9093"], voters

    def names(listeners: str) -> dict[str, str]:
        found = {}
        for listener in listeners.split(","):
            name, sep, address = listener.partition("://")
            assert sep, f"listener {listener!r} is not NAME://host:port"
            found[name] = address
        return found

    listeners = names(env["KAFKA_LISTENERS"])
    advertised = names(env["KAFKA_ADVERTISED_LISTENERS"])
    protocols = dict(item.split(":", 1) for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert advertised.get("PLAINTEXT") == "kafka:9092", advertised
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in listeners
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] not in advertised
    for name in advertised:
        assert name in listeners, f"{name} is advertised but not listened on"
    for name in listeners:
        assert name in protocols, f"listener {name} has no security protocol"
    for name, address in advertised.items():
        if address.startswith("localhost:"):
            host_port = int(address.rpartition(":")[2])
            assert (str(host_port), listeners[name].rpartition(":")[2]) in {
                (str(host), str(target)) for host, target in port_pairs(kafka)
            }, f"{name} advertises {address} but that port is not published"
    cluster_id = env["CLUSTER_ID"]
    assert len(cluster_id) == 22
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16, "CLUSTER_ID is not a base64 UUID"


def test_rabbitmq_relay_uses_the_management_image_and_default_vhost(
    services: dict[str, dict[str, Any]],
) -> None:
    assert "management" in str(services["rabbitmq"]["image"])
    sink = environment(services["relay-rabbitmq"])["RELAY_SINK"]
    assert sink == "amqp://guest:guest@rabbitmq:5672/%2F"


# -- the example shop and consumer ----------------------------------------------


def test_examples_run_a_real_module_and_command(services: dict[str, dict[str, Any]]) -> None:
    assert is_example(services["shop"]) and relay_command(services["shop"]) == "shop"
    assert is_example(services["consumer"]) and relay_command(services["consumer"]) == "consumer"
    module_name = EXAMPLES_ENTRYPOINT[2]
    assert importlib.util.find_spec(module_name) is not None, f"no module {module_name}"
    module = importlib.import_module(module_name)
    assert callable(module.main), f"{module_name} has no main()"
    assert 'if __name__ == "__main__":' in Path(str(module.__file__)).read_text(encoding="utf-8"), (
        f"`python -m {module_name}` would import it and do nothing"
    )
    package = module_name.split(".")[0]
    assert package in copied_sources(EXAMPLES_STAGE), f"the image does not COPY {package}/, which holds {module_name}"
    pythonpath = dockerfile_env(EXAMPLES_STAGE).get("PYTHONPATH", "").split(":")
    destinations = [rest.split()[-1] for rest in dockerfile_values("COPY", EXAMPLES_STAGE) if rest.startswith(package)]
    assert any(f"{path.rstrip('/')}/{package}" in destinations for path in pythonpath), (
        f"{package}/ is copied to {destinations}, not under PYTHONPATH {pythonpath}"
    )
    commands = subcommand_flags(examples.build_parser({}))
    for name, service in services.items():
        if is_example(service):
            assert relay_command(service) in commands, (
                f"{name}: {relay_command(service)!r} is not in {sorted(commands)}"
            )
            assert not profiles(service), f"{name}: the examples start with the default stack"


def test_example_env_vars_are_read_by_the_command_run(services: dict[str, dict[str, Any]]) -> None:
    problems = []
    for name, service in services.items():
        if not is_example(service):
            continue
        command = relay_command(service)
        known = example_env_names(command)
        for variable in environment(service):
            if variable not in known:
                problems.append(f"{name}: `{command}` does not read {variable} (it reads {sorted(known)})")
        if f"{examples.ENV_PREFIXES[command]}DATABASE_URL" not in environment(service):
            problems.append(f"{name}: no {examples.ENV_PREFIXES[command]}DATABASE_URL")
    assert not problems, "\n".join(problems)
    # The mapping the check relies on: real variables are known, made-up ones are not.
    assert {"SHOP_ORDERS_PER_SECOND", "SHOP_DATABASE_URL", "DATABASE_URL"} <= example_env_names("shop")
    assert {"CONSUMER_KAFKA", "CONSUMER_GROUP", "CONSUMER_HEARTBEAT_FILE"} <= example_env_names("consumer")
    assert "SHOP_KAFKA" not in example_env_names("shop")
    assert "CONSUMER_NO_SUCH_SETTING" not in example_env_names("consumer")


def test_example_env_values_are_accepted(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if not is_example(service):
            continue
        args = parsed_example(service)
        check_database_url(args.database_url or "")
        assert args.log_format in ("text", "json")
        if args.command == "shop":
            TableName.parse(args.table)
            assert 0 < args.orders_per_second <= 20, f"{name}: {args.orders_per_second} orders a second is not modest"
            assert 0 < args.failure_rate < 1, f"{name}: no transaction would be rolled back"
            assert args.orders == 0, f"{name}: a shop that stops would be restarted"
        else:
            TableName.parse(args.inbox_table)
            kafka_hosts(args.kafka)


def test_examples_health_checks_read_their_heartbeat(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if not is_example(service):
            continue
        test = " ".join(healthcheck_test(service))
        # Without its own check a service would inherit the image's, which probes the relay's /healthz.
        assert test, f"{name}: no health check of its own"
        assert "/healthz" not in test, f"{name}: probes the relay's /healthz, which it does not serve"
        heartbeat = parsed_example(service).heartbeat_file
        assert heartbeat, f"{name}: no heartbeat file, so its health check has nothing to read"
        assert heartbeat.startswith("/tmp/"), f"{name}: the image's user can write only under /tmp"
        limit = heartbeat_age_limit(service, heartbeat)
        assert limit is not None, f"{name}: the health check does not read {heartbeat}"
        assert examples.HEARTBEAT_INTERVAL_SECONDS < limit <= HEARTBEAT_MAX_AGE_SECONDS, f"{name}: {limit}s"


def test_examples_reach_servers_they_wait_for(services: dict[str, dict[str, Any]]) -> None:
    problems = []
    for name, service in services.items():
        if not is_example(service):
            continue
        args = parsed_example(service)
        hosts = {urlsplit(args.database_url).hostname}
        if args.command == "consumer":
            hosts |= kafka_hosts(args.kafka)
        problems += unwaited_hosts(name, service, hosts, services)
    assert not problems, "\n".join(problems)


def test_examples_wait_for_the_migration(services: dict[str, dict[str, Any]]) -> None:
    for name in ("shop", "consumer"):
        deps = dependencies(services[name])
        assert deps.get("migrate") == "service_completed_successfully", f"{name}: does not wait for migrate"
    assert dependencies(services["consumer"]).get("kafka") == "service_healthy"
    shop = parsed_example(services["shop"])
    migrated = environment(services["migrate"]).get("RELAY_TABLE", "outbox")
    assert shop.table == migrated, f"the shop writes {shop.table!r}, migrate creates {migrated!r}"


def test_the_consumer_reads_what_the_relay_delivers_from_the_shop(services: dict[str, dict[str, Any]]) -> None:
    shop = parsed_example(services["shop"])
    consumer = parsed_example(services["consumer"])
    assert consumer.topic == shop.topic == TOPIC, (shop.topic, consumer.topic)
    relays = [
        environment(service)
        for service in services.values()
        if is_relay(service)
        and relay_command(service) == "run"
        and not profiles(service)
        and environment(service).get("RELAY_TABLE", "outbox") == shop.table
    ]
    assert len(relays) == 1, f"expected one relay of table {shop.table!r} without a profile, found {len(relays)}"
    sink = parse_sink_url(relays[0]["RELAY_SINK"])
    assert isinstance(sink, KafkaSinkConfig), "the shop's table is not relayed to Kafka"
    assert parse_sink_url(consumer.kafka) == sink, "the consumer reads another Kafka than the relay writes to"
    assert urlsplit(relays[0]["RELAY_DATABASE_URL"]).path == urlsplit(shop.database_url).path


# -- Dockerfile ----------------------------------------------------------------


def test_dockerfile_base_is_slim_python_311() -> None:
    for stage in dockerfile_stages():
        base = dockerfile_values("FROM", stage)[0]
        assert base.split()[0].startswith("python:3.11-slim"), f"stage {stage}: {base}"


@pytest.mark.parametrize("stage", [None, EXAMPLES_STAGE])
def test_dockerfile_installs_the_package_then_drops_root(stage: str | None) -> None:
    instructions = dockerfile_instructions(stage)
    installs = [i for i, (kw, rest) in enumerate(instructions) if kw == "RUN" and "pip install" in rest]
    users = [(i, rest) for i, (kw, rest) in enumerate(instructions) if kw == "USER"]
    assert installs, "Dockerfile never runs pip install"
    assert users, "Dockerfile has no USER: the relay would run as root"
    last_index, last_user = users[-1]
    assert last_index > installs[-1], "USER comes before the install, which then has no rights"
    name, _, group = last_user.partition(":")
    assert name not in {"root", "0"} and group not in {"root", "0"}, f"USER {last_user} is root"
    for source in copied_sources(stage):
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"


def test_dockerfile_copies_every_package_the_project_installs() -> None:
    installed = installed_packages()
    assert {"relay", "producers", "consumers"} <= installed, installed
    missing = installed - copied_sources()
    assert not missing, f"the image would install without {sorted(missing)}"


def test_the_relay_image_and_the_wheel_hold_only_the_product() -> None:
    assert not {"examples", "devservers", "tests", "bench"} & installed_packages()
    extra = copied_sources() - installed_packages() - RELAY_IMAGE_FILES
    assert not extra, f"the relay image would hold {sorted(extra)}"


def test_dockerfile_entrypoint_is_the_console_script() -> None:
    scripts = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["scripts"]
    assert PROG in scripts, f"pyproject.toml declares no {PROG} script"
    entrypoint = dockerfile_exec_form("ENTRYPOINT")  # the last stage, which a plain `docker build` makes
    assert entrypoint == [PROG], f"ENTRYPOINT is {entrypoint}, not the {PROG} console script"
    command = dockerfile_exec_form("CMD")
    assert command == ["run"], f"CMD is {command}, not run"


def test_dockerfile_health_check_probes_healthz_on_the_metrics_port() -> None:
    checks = dockerfile_values("HEALTHCHECK")
    assert len(checks) == 1, f"expected one HEALTHCHECK, found {checks}"
    check = checks[0]
    assert " CMD " in f" {check} ", check
    assert "/healthz" in check and "RELAY_METRICS_PORT" in check, check
    assert "curl" not in check and "wget" not in check, "slim images have neither curl nor wget"
    env = dockerfile_env()
    port = env.get("RELAY_METRICS_PORT")
    assert as_port(port) is not None, "the image sets no default RELAY_METRICS_PORT for its health check"
    exposed = {word.split("/")[0] for rest in dockerfile_values("EXPOSE") for word in rest.split()}
    assert port in exposed, f"metrics port {port} is not EXPOSEd ({exposed})"
    assert env.get("RELAY_METRICS_HOST") == "0.0.0.0"


def test_dockerignore_keeps_the_context_small_but_complete() -> None:
    patterns = {
        line.strip().rstrip("/")
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv"} <= patterns, patterns
    for needed in copied_sources() | copied_sources(EXAMPLES_STAGE):
        assert needed not in patterns, f".dockerignore drops {needed}, which the image needs"
