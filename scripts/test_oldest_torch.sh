#!/usr/bin/env bash
# Run the test suite on the oldest torch cnnpar promises (pyproject: torch>=2.5, torchvision>=0.20),
# in its own virtualenv so the system torch is left alone.
#
#   scripts/test_oldest_torch.sh [VENV] [pytest args...]     # default VENV: /tmp/venv-torch25
#   TORCH_WHEEL=/path/torch-2.5.1-...whl scripts/test_oldest_torch.sh   # a wheel already downloaded
#
# The constraints file keeps `pip install -e .[test]` from upgrading torch (keras, jax and
# tensorflow-cpu do not ask for a newer one, but a later release of them might).
# About 3 minutes to install (PyPI's CUDA build of torch pulls its nvidia-* wheels) and 8 minutes
# for the suite on 2 loaded cores.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-/tmp/venv-torch25}"
shift || true
PY="${PYTHON:-python3.11}"
TORCH="${TORCH_VERSION:-2.5.1}"
VISION="${TORCHVISION_VERSION:-0.20.1}"

"$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
CONSTRAINTS="$VENV/constraints.txt"
printf 'torch==%s\ntorchvision==%s\n' "$TORCH" "$VISION" > "$CONSTRAINTS"
"$VPY" -m pip install -q --upgrade pip
"$VPY" -m pip install -q -c "$CONSTRAINTS" "${TORCH_WHEEL:-torch==$TORCH}" "torchvision==$VISION"
"$VPY" -m pip install -q -c "$CONSTRAINTS" -e "$REPO[test]"
"$VPY" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)'
cd "$REPO"
exec "$VPY" -m pytest -q -rfEs "$@"
