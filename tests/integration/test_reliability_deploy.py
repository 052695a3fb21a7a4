"""The token is on by default where people deploy: in every compose profile and every
Kubernetes overlay the buffer requires one and every trainer and searcher sends the same."""

from __future__ import annotations

import pytest

from tests.fixtures.deploy_settings import command_of
from tests.integration.test_deploy_configs import PROFILES, Compose
from tests.integration.test_deploy_k8s import OVERLAYS, container_env, documents, workloads

TOKEN_VARIABLE = {"buffer": "TBA_BUFFER__AUTH_TOKEN"}
CLIENT_TOKEN = "TBA_CLIENT__AUTH_TOKEN"


def _tokens(envs: list[tuple[tuple[str, ...] | None, dict[str, str]]]) -> set[str]:
    """The token of every tba container; fails on a container without one."""
    found = set()
    for command, env in envs:
        if command is None:
            continue
        variable = TOKEN_VARIABLE.get(command[0], CLIENT_TOKEN)
        assert env.get(variable), f"`tba {' '.join(command)}` runs without {variable}"
        found.add(env[variable])
    return found


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Compose:
    return Compose(tmp_path_factory.mktemp("docker-config"))


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_services_share_one_token(compose: Compose, profile: str) -> None:
    services = compose.config(profile)["services"].values()
    envs = [(command_of(s.get("command") or []), s.get("environment") or {}) for s in services]
    assert ("buffer", "serve") in {command for command, _ in envs}
    tokens = _tokens(envs)
    assert len(tokens) == 1 and len(tokens.pop()) >= 16


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kubernetes_pods_share_one_token_from_a_secret(overlay: str) -> None:
    docs = documents(overlay)
    envs = [
        (command_of(container.get("args") or []), container_env(docs, container))
        for _, pod in workloads(overlay)
        for container in pod["spec"]["containers"]
    ]
    assert len(_tokens(envs)) == 1
    for _, pod in workloads(overlay):
        for container in pod["spec"]["containers"]:
            for item in container.get("env") or []:
                if item["name"].endswith("__AUTH_TOKEN"):
                    assert item["valueFrom"]["secretKeyRef"]["name"] == "tba-auth"
