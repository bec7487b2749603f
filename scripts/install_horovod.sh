#!/usr/bin/env bash
# Build Horovod 0.28.1 (the last release) from its PyPI sdist, with cnnpar's small patch, into its
# own virtualenv, for `cnnpar train --strategy horovod` on the CPU (Gloo, no MPI, no CUDA).
#
#   scripts/install_horovod.sh [VENV]            # default VENV: .venv-horovod in the repo root
#   HOROVOD_TORCH=2.13.0 scripts/install_horovod.sh   # put that torch into the venv instead of
#                                                      # seeing the system one
#
# Why a patch: 0.28.1 (June 2023) pins C++14, and current torch headers need C++17 (torch >= 2.14:
# C++20); and a CUDA build of torch on a machine without a CUDA runtime sends its CMake looking for
# the CUDA toolkit (HOROVOD_CPU_ONLY=1 stops that). See scripts/horovod-0.28.1.patch. Why --no-build-isolation: Horovod's CMake imports torch
# to find its headers and ABI, so the build must see the torch it will run against, not a fresh one
# pip would download into an isolated build environment. Takes about 5-12 minutes on 2 cores.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
VENV="${1:-$REPO/.venv-horovod}"
PY="${PYTHON:-python3}"
JOBS="${HOROVOD_BUILD_JOBS:-$(nproc)}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "== virtualenv $VENV (sees the system site-packages: torch, numpy, cnnpar's dependencies)"
"$PY" -m venv --system-site-packages "$VENV"
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade "setuptools<81" wheel packaging
if [[ -n "${HOROVOD_TORCH:-}" ]]; then
    "$VPY" -m pip install -q "torch==$HOROVOD_TORCH"
fi
TORCH_VERSION="$("$VPY" -c 'import torch; print(torch.__version__.split("+")[0])')"
# torch >= 2.14 headers use C++20 features; earlier 2.x need C++17.
CXX_STD="$("$VPY" -c "v=tuple(int(p) for p in '$TORCH_VERSION'.split('.')[:2]); print(20 if v >= (2, 14) else 17)")"
echo "== torch $TORCH_VERSION -> C++$CXX_STD"

echo "== Horovod 0.28.1 sdist"
"$VPY" -m pip download -q --no-deps --no-binary :all: horovod==0.28.1 -d "$WORK"
tar xzf "$WORK/horovod-0.28.1.tar.gz" -C "$WORK"
(cd "$WORK" && patch -p1 --forward < "$HERE/horovod-0.28.1.patch")

echo "== build (Gloo only, CPU; $JOBS jobs)"
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_ONLY="${HOROVOD_CPU_ONLY:-1}"
export HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=gloo HOROVOD_GPU_OPERATIONS=
export HOROVOD_CXX_STANDARD="$CXX_STD" MAKEFLAGS="-j$JOBS" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
"$VPY" -m pip install -v --no-build-isolation --no-deps "$WORK/horovod-0.28.1" > "$WORK/build.log" 2>&1 || {
    echo "build failed; the last lines of the log:" >&2
    tail -60 "$WORK/build.log" >&2
    cp "$WORK/build.log" "$VENV/horovod-build.log" && echo "full log: $VENV/horovod-build.log" >&2
    exit 1
}
"$VPY" -m pip install -q cloudpickle psutil pyyaml
"$VPY" -m pip install -q --no-deps -e "$REPO"

echo "== check"
"$VPY" -c 'import horovod, horovod.torch as hvd; print("horovod", horovod.__version__, "gloo built:", hvd.gloo_built())'
"$VENV/bin/horovodrun" --check-build
echo "done: $VENV/bin/horovodrun -np 2 -H localhost:2 $VENV/bin/python -m cnnpar train --strategy horovod"
