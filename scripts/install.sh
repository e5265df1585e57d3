#!/usr/bin/env bash
# The one install step of gridgpt on Debian or Ubuntu, called by `make run`, `make test` and
# .ci/run: installs what is missing with apt-get when run as root, otherwise prints the exact
# `sudo apt-get install` line and stops. Installs nothing that is already there.
#   scripts/install.sh [EXTRA-PACKAGE ...]    (CI adds clang for its fuzz step)
# OpenBLAS comes in its OpenMP flavour (libopenblas-openmp-dev): the default pthread flavour
# that libopenblas-dev alone brings starts threads of its own that fight the trainer's OpenMP
# threads for the cores (measured: make run 2.2x slower, half of it in the kernel).
set -euo pipefail
packages="build-essential pkg-config libopenmpi-dev openmpi-bin libopenblas-dev libopenblas-openmp-dev zlib1g-dev $*"
multiarch=$(gcc -print-multiarch 2>/dev/null || dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
missing=""
command -v gcc >/dev/null || missing="gcc"
command -v make >/dev/null || missing="$missing make"
command -v mpicc >/dev/null || missing="$missing mpicc"
command -v pkg-config >/dev/null || missing="$missing pkg-config"
[ -f /usr/lib/$multiarch/openblas-openmp/pkgconfig/openblas.pc ] || missing="$missing openblas-openmp"
[ -f /usr/include/zlib.h ] || missing="$missing zlib"
for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "error: missing:$missing. Install them with:" >&2
    echo "  sudo apt-get install -y $packages" >&2
    exit 1
fi
echo "installing $packages (missing:$missing)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $packages
