#!/usr/bin/env bash
# Stop the test cluster started by setup_cluster.sh: slurmd, slurmctld, munged.
#
#   sudo bash tests/slurm/teardown_cluster.sh           # stop the daemons
#   sudo bash tests/slurm/teardown_cluster.sh --purge   # and forget saved jobs/node state
#
# Packages, configuration, the munge key and /dev/nvidia0..3 stay, so the next
# setup_cluster.sh is quick.
set -euo pipefail

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

if [ -d /run/systemd/system ]; then
    systemctl stop slurmd slurmctld munge || true
else
    stop /run/slurmd.pid slurmd
    stop /run/slurmctld.pid slurmctld
    stop /run/munge/munged.pid munged
fi

if [ "$purge" -eq 1 ]; then
    rm -rf /var/spool/slurmctld/* /var/spool/slurmd/*
    echo "teardown_cluster: purged /var/spool/slurmctld and /var/spool/slurmd"
fi
