#!/usr/bin/env bash
# Build Horovod 0.28.1 (the last release) from its PyPI sdist, with cnnpar's small patch, into its
# own virtualenv, for `cnnpar train --strategy horovod` on the CPU (Gloo, no MPI, no CUDA).
#
#   scripts/install_horovod.sh [VENV]            # default VENV: .venv-horovod in the repo root
#   HOROVOD_TORCH=2.13.0 scripts/install_horovod.sh   # put that torch into the venv instead of
#                                                      # seeing the system one
#
# The venv sees the system site-packages and, when the script runs inside a virtualenv (the README's
# .venv), that virtualenv's packages: a torch there is used, not installed again. Whatever cnnpar
# needs and neither has (torch included, on a fresh machine) pip installs into the venv first,
# because Horovod's build imports torch. An existing VENV is reused (the active .venv works too).
#
# Why a patch: 0.28.1 (June 2023) pins C++14, and current torch headers need C++17 (torch >= 2.14:
# C++20); and a CUDA build of torch on a machine without a CUDA runtime sends its CMake looking for
# the CUDA toolkit (HOROVOD_CPU_ONLY=1 stops that). See scripts/horovod-0.28.1.patch. Why
# --no-build-isolation: Horovod's CMake imports torch to find its headers and ABI, so the build must
# see the torch it will run against, not a fresh one pip would download into an isolated build
# environment.
#
# The build takes 5-6 minutes of 2 cores, so its wheel is kept in
# ${CNNPAR_CACHE:-~/.cache/cnnpar}/horovod/<key>/, the key naming the Horovod version, the torch
# version (local tag included: +cpu and +cu130 builds differ), the Python tag and a hash of the patch
# and the build settings below. A later run with the same key installs that wheel in seconds.
set -euo pipefail
HOROVOD_VERSION=0.28.1
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
VENV="${1:-$REPO/.venv-horovod}"
PY="${PYTHON:-python3}"
JOBS="${HOROVOD_BUILD_JOBS:-$(nproc)}"
CACHE_ROOT="${CNNPAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cnnpar}/horovod"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

OUTER_PREFIX="$("$PY" -c 'import sys; print(sys.prefix if sys.prefix != sys.base_prefix else "")')"
if [[ -x "$VENV/bin/python" ]]; then
    echo "== virtualenv $VENV (exists: reused)"
else
    echo "== virtualenv $VENV (sees the system site-packages)"
    "$PY" -m venv --system-site-packages "$VENV"
fi
VPY="$VENV/bin/python"
if [[ -n "$OUTER_PREFIX" && "$(cd "$OUTER_PREFIX" && pwd -P)" != "$(cd "$VENV" && pwd -P)" ]]; then
    # Run from inside a virtualenv (the README's .venv), the new venv's "system" site-packages are
    # the base interpreter's, not that venv's: a .pth makes it see the calling venv's packages too
    # (torch and cnnpar's dependencies), so they are not installed a second time.
    OUTER_SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    VENV_SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "import site; site.addsitedir('$OUTER_SITE')" > "$VENV_SITE/_cnnpar_calling_venv.pth"
    echo "== $VENV also sees $OUTER_SITE (the virtualenv this script was started from)"
fi
"$VPY" -m pip install -q --upgrade "setuptools<81" wheel packaging
if [[ -n "${HOROVOD_TORCH:-}" ]]; then
    "$VPY" -m pip install -q "torch==$HOROVOD_TORCH"
fi
if ! "$VPY" -c 'import torch' 2>/dev/null; then
    echo "== torch is not installed for $PY's interpreter: pip installs cnnpar's dependencies, torch included, into $VENV"
fi
# cnnpar itself (editable) with its dependencies, before the build: the build imports torch.
"$VPY" -m pip install -q -e "$REPO"
TORCH_FULL="$("$VPY" -c 'import torch; print(torch.__version__)')"
TORCH_VERSION="${TORCH_FULL%%+*}"
# torch >= 2.14 headers use C++20 features; earlier 2.x need C++17.
CXX_STD="$("$VPY" -c "v=tuple(int(p) for p in '$TORCH_VERSION'.split('.')[:2]); print(20 if v >= (2, 14) else 17)")"
PY_TAG="$("$VPY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
echo "== torch $TORCH_FULL -> C++$CXX_STD"

BUILD_ENV=(
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    "HOROVOD_CPU_ONLY=${HOROVOD_CPU_ONLY:-1}" HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1
    HOROVOD_CPU_OPERATIONS=gloo HOROVOD_GPU_OPERATIONS= "HOROVOD_CXX_STANDARD=$CXX_STD"
)
SETTINGS_HASH="$( (cat "$HERE/horovod-$HOROVOD_VERSION.patch"; printf '%s\n' "${BUILD_ENV[@]}") | sha256sum | cut -c1-12)"
KEY="horovod-$HOROVOD_VERSION-torch-$TORCH_FULL-$PY_TAG-$SETTINGS_HASH"
CACHED="$CACHE_ROOT/$KEY"

if compgen -G "$CACHED/horovod-*.whl" > /dev/null; then
    echo "== cached build: $CACHED"
else
    echo "== Horovod $HOROVOD_VERSION sdist"
    "$VPY" -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$WORK"
    tar xzf "$WORK/horovod-$HOROVOD_VERSION.tar.gz" -C "$WORK"
    (cd "$WORK" && patch -p1 --forward < "$HERE/horovod-$HOROVOD_VERSION.patch")
    echo "== build (Gloo only, CPU; $JOBS jobs; about 5-6 minutes on 2 cores) -> $CACHED"
    export "${BUILD_ENV[@]}" MAKEFLAGS="-j$JOBS" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
    "$VPY" -m pip wheel -v --no-build-isolation --no-deps -w "$WORK/wheel" "$WORK/horovod-$HOROVOD_VERSION" \
        > "$WORK/build.log" 2>&1 || {
        echo "build failed; the last lines of the log:" >&2
        tail -60 "$WORK/build.log" >&2
        cp "$WORK/build.log" "$VENV/horovod-build.log" && echo "full log: $VENV/horovod-build.log" >&2
        exit 1
    }
    # Into the cache by rename, so a build cut short never leaves a folder that looks finished.
    mkdir -p "$CACHE_ROOT"
    STAGE="$(mktemp -d "$CACHE_ROOT/.partial.XXXXXX")"
    cp "$WORK"/wheel/horovod-*.whl "$STAGE/"
    chmod 755 "$STAGE"
    rm -rf "$CACHED" && mv "$STAGE" "$CACHED"
fi
# With its runtime dependencies (cloudpickle, psutil, pyyaml, packaging); torch is already there.
"$VPY" -m pip install -q --force-reinstall --no-deps "$CACHED"/horovod-*.whl
"$VPY" -m pip install -q cloudpickle psutil pyyaml packaging

echo "== check"
"$VPY" -c 'import horovod, horovod.torch as hvd; print("horovod", horovod.__version__, "gloo built:", hvd.gloo_built())'
"$VENV/bin/horovodrun" --check-build
echo "done: $VENV/bin/horovodrun -np 2 -H localhost:2 $VENV/bin/python -m cnnpar train --strategy horovod"
