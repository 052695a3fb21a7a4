#!/usr/bin/env bash
# GPU check of TBA, for a machine with a CUDA GPU and no internet access (no GPU has run this
# code yet). In under 5 minutes it runs the buffer service, a bf16 trainer on CUDA and a
# searcher on the transformers engine on CUDA (then on vLLM, where vLLM is importable) with the
# tiny demo model for about 50 steps, through one run file written from
# configs/arithmetic-demo.toml (`tba local --config` starts the three as processes), and checks:
#   cuda                 torch sees a CUDA device that supports bf16
#   run-file             every service resolves the one run file, and the same temperature
#   <engine>/run         the run trains every step and exits cleanly
#   <engine>/trainer-device, <engine>/searcher-0-device
#                        each service was told cuda (and holds GPU memory, where nvidia-smi
#                        shows this run's pids)
#   <engine>/hot-reload  the searcher loaded newer weight versions while it ran
#   <engine>/learning    training reward or held-out accuracy rises
# One line per check (PASS name: detail / FAIL name: detail / SKIP name: why); exit code 1 on
# any FAIL. No install of tba is needed: it runs from this checkout (PYTHONPATH=src).
#
# Usage: scripts/gpu_check.sh [--dry-run] [--steps N] [--workdir DIR]
#   PYTHON=python3          the interpreter with the machine's CUDA torch (default python3)
#   GPU_CHECK_WHEELS=DIR    first install, offline, the wheels brought along in DIR
#   GPU_CHECK_DEVICE=cpu    the same as --dry-run: the same flow on CPU, fewer steps, no vLLM
#                           (the test suite runs it: tests/integration/test_gpu_check.py)
#
# What to bring: torch comes with the machine (and vLLM, if it has it); tba needs these pure
# or small packages besides. On a machine with internet access, for the GPU machine's Python
# version and platform (here 3.11, x86_64):
#   pip download -d wheels --only-binary=:all: --python-version 3.11 \
#       --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
#       pydantic pydantic-settings grpcio grpcio-health-checking grpcio-reflection protobuf \
#       numpy prometheus-client tomli-w fastapi uvicorn sortedcontainers \
#       'transformers<5.20' safetensors rich matplotlib
# (their dependencies come along; about 150 MB), copy `wheels/` and this checkout over, then
#   GPU_CHECK_WHEELS=wheels scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
REQUIREMENTS=(pydantic pydantic-settings grpcio grpcio-health-checking grpcio-reflection
  protobuf numpy prometheus-client tomli-w fastapi uvicorn sortedcontainers
  "transformers<5.20" safetensors rich matplotlib)

if [[ -n "${GPU_CHECK_WHEELS:-}" ]]; then
  # Packages already installed and good enough stay; only missing ones come from DIR.
  "$PYTHON" -m pip install --quiet --no-index --find-links "$GPU_CHECK_WHEELS" "${REQUIREMENTS[@]}"
fi

# Name every missing module at once, rather than the first one in a traceback.
"$PYTHON" - <<'PY'
import importlib.util
import sys

modules = ["torch", "pydantic", "pydantic_settings", "grpc", "grpc_health", "grpc_reflection",
           "google.protobuf", "numpy", "prometheus_client", "tomli_w", "fastapi", "uvicorn",
           "sortedcontainers", "transformers", "safetensors", "rich", "matplotlib"]
missing = [m for m in modules if importlib.util.find_spec(m.split(".")[0]) is None]
if missing:
    print(f"FAIL imports: missing {', '.join(missing)} (bring their wheels: see the top of "
          "scripts/gpu_check.sh, then GPU_CHECK_WHEELS=DIR)")
    sys.exit(1)
PY

exec "$PYTHON" scripts/gpu_check.py "$@"
