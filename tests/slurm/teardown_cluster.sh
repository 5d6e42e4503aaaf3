#!/usr/bin/env bash
# Stop the test cluster started by setup_cluster.sh: slurmd, slurmctld, munged.
#
#   sudo bash tests/slurm/teardown_cluster.sh           # stop the daemons
#   sudo bash tests/slurm/teardown_cluster.sh --purge   # and forget saved jobs/node state
#   SLURM_PREFIX=/opt/slurm-26.05 bash tests/slurm/teardown_cluster.sh   # the Slurm built there
#
# Packages, configuration, the munge key and /dev/nvidia0..3 stay, so the next
# setup_cluster.sh is quick.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tests/slurm/slurm_paths.sh
. "$here/slurm_paths.sh"
purge=0
[ "${1:-}" = "--purge" ] && purge=1
[ "$(id -u)" -eq 0 ] || { echo "teardown_cluster: must run as root" >&2; exit 1; }

stop() {  # stop PIDFILE NAME: only the process the pid file names, and only if it is NAME
    local pid
    [ -s "$1" ] || return 0
    pid="$(cat "$1")"
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 0
    echo "teardown_cluster: stopping $2 ($pid)"
    kill "$pid"
    for _ in $(seq 50); do
        [ -d "/proc/$pid" ] || return 0
        sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true
}

if [ "$prefix" = /usr ] && [ -d /run/systemd/system ]; then
    systemctl stop slurmd slurmctld munge || true
else
    stop "$run_dir/slurmd.pid" slurmd
    stop "$run_dir/slurmctld.pid" slurmctld
    stop /run/munge/munged.pid munged
fi

if [ "$purge" -eq 1 ]; then
    rm -rf "${state_dir:?}"/* "${spool_dir:?}"/*
    echo "teardown_cluster: purged $state_dir and $spool_dir"
fi
