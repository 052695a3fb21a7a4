"""Offline checks of the Kubernetes manifests with the real tools: every overlay rendered by
`kubectl kustomize` and validated by `kubernetes-validate --strict`; then, on the rendered
objects, the run file (one ConfigMap, mounted by every tba container, a copy of its source in
configs/), the TBA_* variables of every container (ConfigMaps and Secrets resolved) against
the settings of its command over that run file, the pods' lock-down and GPUs (the gpu
overlay's trainer: two GPUs under DeepSpeed), the buffer's gRPC probes (readiness and
liveness apart), and which pods the NetworkPolicies let reach Redis and the buffer.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tba.buffer.transport.grpc_server import LIVENESS, READINESS
from tests.fixtures.deploy_settings import (
    RUN_FILE_PATH,
    check_tba_env,
    command_of,
    container_argv,
    container_env,
    containers,
    k8s_workloads,
    kustomize,
    metrics_listener,
    mounted_files,
    run_settings_in,
    run_tool,
)

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = sorted(p.name for p in (ROOT / "deploy/k8s/overlays").iterdir() if p.is_dir())
# Each overlay's run.toml is a copy of a run file of configs/ (kustomize's load restrictor
# reads only files under the overlay).
RUN_FILE_SOURCES = {
    "gpu": "configs/gsm8k-rhomath-1b.toml",
    "cpu-demo": "configs/arithmetic-demo.toml",
}


@cache
def rendered(overlay: str) -> str:
    return kustomize(ROOT / "deploy/k8s/overlays" / overlay)


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
    return k8s_workloads(documents(overlay))


def tba_containers(overlay: str) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(where, pod, container) of every container that runs a tba command."""
    for workload, pod in workloads(overlay):
        for container in containers(pod):
            if command_of(container_argv(container)) is not None:
                yield (
                    f"{overlay}: {workload['metadata']['name']}/{container['name']}",
                    pod,
                    container,
                )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_tba_variables_are_settings(overlay: str, tmp_path: Path) -> None:
    docs = documents(overlay)
    for workload, pod in workloads(overlay):
        for container in containers(pod):
            where = f"{overlay}: {workload['metadata']['name']}/{container['name']}"
            run_file = None
            if RUN_FILE_PATH in mounted_files(docs, pod, container):
                run_file = tmp_path / "run.toml"
                run_file.write_text(mounted_files(docs, pod, container)[RUN_FILE_PATH])
            env = container_env(docs, container)
            check_tba_env(where, command_of(container_argv(container)), env, run_file)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_every_tba_container_reads_the_one_run_file(overlay: str) -> None:
    docs = documents(overlay)
    run_files = set()
    commands = set()
    for where, pod, container in tba_containers(overlay):
        assert container_env(docs, container)["TBA_CONFIG"] == RUN_FILE_PATH, where
        run_files.add(mounted_files(docs, pod, container)[RUN_FILE_PATH])
        commands.add(command_of(container_argv(container)))
    assert commands == {("buffer", "serve"), ("trainer", "run"), ("searcher", "run")}
    assert run_files == {(ROOT / RUN_FILE_SOURCES[overlay]).read_text()}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_run_file_is_a_copy_of_its_source_in_configs(overlay: str) -> None:
    copy = ROOT / "deploy/k8s/overlays" / overlay / "run.toml"
    source = ROOT / RUN_FILE_SOURCES[overlay]
    assert copy.read_bytes() == source.read_bytes(), f"run: cp {source} {copy}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_environment_leaves_the_run_to_the_run_file(overlay: str) -> None:
    docs = documents(overlay)
    for where, _, container in tba_containers(overlay):
        assert run_settings_in(container_env(docs, container)) == [], where


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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_pods_serve_metrics_where_their_scrape_annotations_say(overlay: str) -> None:
    """Every tba pod template carries the prometheus.io annotations, naming a port of its
    container on which its command serves /metrics on every interface, which the
    NetworkPolicies let any pod reach (Prometheus)."""
    from tests.fixtures.deploy_harness import Image

    docs = documents(overlay)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    stranger = {"app.kubernetes.io/name": "prometheus"}
    for where, pod, container in tba_containers(overlay):
        annotations = pod["metadata"].get("annotations") or {}
        assert annotations.get("prometheus.io/scrape") == "true", where
        assert annotations.get("prometheus.io/path") == "/metrics", where
        port = int(annotations["prometheus.io/port"])
        assert port in {p["containerPort"] for p in container.get("ports") or []}, where
        env = {**Image.of(container["image"]).env, **container_env(docs, container)}
        command = command_of(container_argv(container))
        assert command is not None
        assert metrics_listener(command, env) == ("0.0.0.0", port), where
        assert admitted(policies, stranger, pod["metadata"]["labels"], port), where


def _gpus(container: dict[str, Any]) -> int:
    return int(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))


def pods_by_app(overlay: str) -> dict[str, dict[str, Any]]:
    return {
        pod["metadata"]["labels"]["app.kubernetes.io/name"]: pod for _, pod in workloads(overlay)
    }


def test_gpu_overlay_trains_on_two_gpus_and_gives_each_searcher_one() -> None:
    pods = pods_by_app("gpu")
    (trainer,) = pods["trainer"]["spec"]["containers"]
    assert _gpus(trainer) == 2
    assert [_gpus(c) for c in pods["searcher"]["spec"]["containers"]] == [1]
    searchers = [w for w, _ in workloads("gpu") if w["metadata"]["name"] == "searcher"]
    assert searchers[0]["spec"]["replicas"] >= 2


def test_gpu_overlay_trainer_runs_one_deepspeed_rank_per_gpu() -> None:
    from deepspeed.launcher.runner import parse_args

    (trainer,) = pods_by_app("gpu")["trainer"]["spec"]["containers"]
    argv = container_argv(trainer)
    assert argv[0] == "deepspeed"
    # DeepSpeed's own parser: the launcher takes these flags, then `tba` as the module.
    launcher = parse_args(argv[1:])
    assert launcher.num_gpus == _gpus(trainer)
    assert launcher.module and launcher.no_local_rank
    assert [launcher.user_script, *launcher.user_args] == ["tba", "trainer", "run"]
    env = container_env(documents("gpu"), trainer)
    assert env["TBA_DISTRIBUTED__BACKEND"] == "deepspeed"


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
