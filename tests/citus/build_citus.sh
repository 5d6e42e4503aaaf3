#!/usr/bin/env bash
# Build and install Citus into Debian's PostgreSQL 15 for the Citus tests (tests/citus/), unless
# citus.so is already installed. Usage: build_citus.sh [path to citus-<version>.tar.gz | --deps-only]
# The tarball is Citus's source as tagged upstream (AGPL; it runs as a separate server and nothing
# of it enters this repository). Needs root (apt-get, make install). About 8 minutes on 2 cores.
set -euo pipefail

version=13.0.5
tarball="${1:-${CITUS_TARBALL:-}}"
pg_config=/usr/lib/postgresql/15/bin/pg_config
say() { echo "build_citus: $*"; }

# shellcheck source=../apt_missing.sh
. "$(dirname "$0")/../apt_missing.sh"
install_missing build_citus postgresql-15 postgresql-server-dev-15 libkrb5-dev liblz4-dev libzstd-dev \
    build-essential
# --deps-only: the packages above, no build (CI installs every package first, then builds in the background).
[ "$tarball" = "--deps-only" ] && exit 0

libdir="$("$pg_config" --pkglibdir)"
if [ -f "$libdir/citus.so" ]; then
    say "citus.so already installed in $libdir; nothing to build"
    exit 0
fi
if [ -z "$tarball" ] || [ ! -f "$tarball" ]; then
    say "no Citus source tarball (give its path, or CITUS_TARBALL): '$tarball'" >&2
    exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar xzf "$tarball" -C "$work"
cd "$work/citus-$version"
say "configuring Citus $version against $("$pg_config" --version)"
./configure PG_CONFIG="$pg_config" --without-libcurl >"$work/configure.log" 2>&1 \
    || { tail -30 "$work/configure.log"; exit 1; }
say "building (make -j2; several minutes)"
make -j2 >"$work/make.log" 2>&1 || { tail -40 "$work/make.log"; exit 1; }
make install >"$work/install.log" 2>&1 || { tail -20 "$work/install.log"; exit 1; }
say "installed $libdir/citus.so"
