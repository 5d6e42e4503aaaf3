#!/usr/bin/env bash
# Build and install Slurm 26.05.3 into /opt/slurm-26.05 for the real-Slurm tests on today's Slurm
# (tests/slurm/, run by .ci/run after Debian's 22.05), unless that prefix already holds it.
# Usage: build_slurm.sh [path to slurm-26.05.3.tar.gz | --deps-only]
# The tarball is Slurm's source as tagged upstream (GPL-2.0; it runs as the test cluster's own
# daemons and commands, nothing of it enters this repository). Needs root (apt-get, make install).
# About 5.5 minutes on 2 cores. The configuration lives in <prefix>/etc (setup_cluster.sh writes it).
set -euo pipefail

version=26.05.3
prefix="${SLURM_PREFIX:-/opt/slurm-26.05}"
tarball="${1:-${SLURM_TARBALL:-}}"
say() { echo "build_slurm: $*"; }

# Slurm's build dependencies (munge: the daemon, shared with Debian's Slurm).
# shellcheck source=../apt_missing.sh
. "$(dirname "$0")/../apt_missing.sh"
install_missing build_slurm build-essential pkg-config libjson-c-dev libmunge-dev libyaml-dev liblz4-dev \
    libreadline-dev libssl-dev libdbus-1-dev libbpf-dev munge
# --deps-only: the packages above, no build (CI installs every package first, then builds in the background).
[ "$tarball" = "--deps-only" ] && exit 0

# `slurmd -V` prints "slurm 26.05.3": an install of another version (or a half-finished one) is rebuilt.
if [ -x "$prefix/sbin/slurmd" ] && [ "$("$prefix/sbin/slurmd" -V 2>/dev/null)" = "slurm $version" ]; then
    say "Slurm $version already installed in $prefix; nothing to build"
    exit 0
fi
if [ -z "$tarball" ] || [ ! -f "$tarball" ]; then
    say "no Slurm source tarball (give its path, or SLURM_TARBALL): '$tarball'" >&2
    exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar xzf "$tarball" -C "$work"
src="$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'slurm-*' | head -n1)"
[ -n "$src" ] || { say "no slurm-* folder in $tarball" >&2; exit 1; }
cd "$src"
say "configuring Slurm $version for $prefix"
./configure --prefix="$prefix" --sysconfdir="$prefix/etc" --with-munge --with-json \
    >"$work/configure.log" 2>&1 || { tail -30 "$work/configure.log"; exit 1; }
say "building (make -j2; several minutes)"
make -j2 >"$work/make.log" 2>&1 || { tail -40 "$work/make.log"; exit 1; }
make install >"$work/install.log" 2>&1 || { tail -20 "$work/install.log"; exit 1; }
install -d -m 0755 "$prefix/etc"
say "installed $("$prefix/sbin/slurmd" -V) in $prefix"
