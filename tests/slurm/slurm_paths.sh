# Where the test cluster's Slurm lives, for setup_cluster.sh and teardown_cluster.sh (sourced).
#
# SLURM_PREFIX (default /usr): Debian's packages, configuration in /etc/slurm and the state, logs
# and pid files where Debian's Slurm has always kept them here. Any other prefix (a Slurm built from
# source, e.g. /opt/slurm-26.05 by build_slurm.sh, with --sysconfdir=<prefix>/etc): its own
# configuration folder and state, log and pid folders named after it, so that the two versions never
# read each other's saved state (a newer slurmctld's state files are not an older one's).
# shellcheck shell=bash

prefix="${SLURM_PREFIX:-/usr}"
prefix="${prefix%/}"
[ -n "$prefix" ] || prefix=/usr
if [ "$prefix" = /usr ]; then
    conf_dir=/etc/slurm
    state_dir=/var/spool/slurmctld
    spool_dir=/var/spool/slurmd
    log_dir=/var/log/slurm
    run_dir=/run
else
    name="$(basename "$prefix")"
    conf_dir="$prefix/etc"
    state_dir="/var/spool/$name/slurmctld"
    spool_dir="/var/spool/$name/slurmd"
    log_dir="/var/log/$name"
    run_dir="/run/$name"
fi
slurmctld="$prefix/sbin/slurmctld"
slurmd="$prefix/sbin/slurmd"
sinfo="$prefix/bin/sinfo"
scontrol="$prefix/bin/scontrol"
squeue="$prefix/bin/squeue"

# other_slurm_running: a slurmctld or slurmd of another installation is running (both would want
# the same ports and the same node). Debian's are links (/usr/sbin/slurmd -> slurmd-wlm): compared resolved.
other_slurm_running() {
    local comm pid exe ours_ctld ours_d
    ours_ctld="$(readlink -f "$slurmctld")"
    ours_d="$(readlink -f "$slurmd")"
    for comm in /proc/[0-9]*/comm; do
        case "$(cat "$comm" 2>/dev/null)" in slurmctld|slurmd) ;; *) continue ;; esac
        pid="${comm#/proc/}"; pid="${pid%/comm}"
        exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
        [ -n "$exe" ] || continue
        case "$exe" in "$ours_ctld"|"$ours_d") ;; *) return 0 ;; esac
    done
    return 1
}
