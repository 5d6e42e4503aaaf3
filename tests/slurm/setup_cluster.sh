#!/usr/bin/env bash
# Bring up a single-node Slurm test cluster with four fake GPUs and jobsight's hooks.
#
#   sudo bash tests/slurm/setup_cluster.sh      # idempotent; re-run at will
#   sudo bash tests/slurm/teardown_cluster.sh   # stop the daemons
#
# Installs slurmctld, slurmd, slurm-client and munge from apt if missing, creates
# the munge key and /dev/nvidia0..3 (char 195:N), writes /etc/slurm/{slurm,gres,cgroup}.conf
# from tests/slurm/*.in, writes /etc/jobsight/hooks.env (unless an admin's file is
# there), starts munged, slurmctld and slurmd, and waits for the node to be idle.
#
# With SLURM_PREFIX (a Slurm built from source, e.g. /opt/slurm-26.05 by tests/slurm/build_slurm.sh),
# the daemons and commands are that prefix's, the configuration goes to its sysconfdir
# (<prefix>/etc), its state, logs and pid files to folders of its own (/var/spool/<name>,
# /var/log/<name>, /run/<name>, <name> the prefix's last component), and munge (from apt) is
# shared. One Slurm runs at a time: the other's daemons must be stopped first (teardown_cluster.sh).
#
# Environment:
#   SLURM_PREFIX        where Slurm is installed (default /usr: Debian's packages, /etc/slurm)
#   JOBSIGHT_BIN        jobsight executable the hooks call
#                       (default: <repo>/.venv/bin/jobsight, else /usr/local/bin/jobsight)
#   JOBSIGHT_URL, JOBSIGHT_CONFIG, JOBSIGHT_HOOK_TIMEOUT, JOBSIGHT_CLUSTER, JOBSIGHT_NODE,
#   JOBSIGHT_SECRET_FILE, JOBSIGHT_TOKEN_DIR, JOBSIGHT_REGISTRATION_DIR, JOBSIGHT_SPOOL_DIR,
#   JOBSIGHT_HOOK_LOG    copied into hooks.env when set (tests/slurm/test_e2e.py sets them)
#   SLURM_WAIT_S        how long to wait for the node to become idle (default 60)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
slurm_dir="$repo/slurm"
host="$(hostname -s)"
wait_s="${SLURM_WAIT_S:-60}"
marker="# written by jobsight tests/slurm/setup_cluster.sh"
# shellcheck source=tests/slurm/slurm_paths.sh
. "$here/slurm_paths.sh"

die() { echo "setup_cluster: ERROR: $*" >&2; exit 1; }
say() { echo "setup_cluster: $*"; }

[ "$(id -u)" -eq 0 ] || die "must run as root (installs packages, mknod, starts daemons)"
for hook in prolog epilog task_prolog; do
    [ -x "$slurm_dir/$hook" ] || die "$slurm_dir/$hook missing or not executable"
done

# slurmd runs the hooks as root and the task prolog as the job user: jobs of users other than root
# (tests/slurm/test_hostile_jobs.py submits as an ordinary user) need every directory above the
# wrappers, and above the interpreter jobsight runs on, traversable by others. On this test cluster
# they are made so (o+x: enter, not list): a venv on a Python under /root (pyenv) is otherwise out of
# every user's reach, and their task prolog would silently export nothing.
traversable() {  # traversable PATH: o+x on every directory above PATH
    local d
    d="$(dirname "$1")"
    while [ "$d" != / ]; do
        if [ "$(( 0$(stat -c %a "$d") & 01 ))" -eq 0 ]; then
            chmod o+x "$d" && say "made $d traversable by others (the job user's task prolog runs below it)"
        fi
        d="$(dirname "$d")"
    done
}
traversable "$slurm_dir/task_prolog"
# --- packages ---------------------------------------------------------------------
if [ "$prefix" = /usr ]; then pkgs=(slurmctld slurmd slurm-client munge); else pkgs=(munge); fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/jobsight-slurm-apt.log 2>&1 \
        || { apt-get update -q >>/tmp/jobsight-slurm-apt.log 2>&1 \
             && apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/jobsight-slurm-apt.log 2>&1; } \
        || die "apt-get install ${missing[*]} failed; see /tmp/jobsight-slurm-apt.log"
fi
for b in "$slurmctld" "$slurmd" /usr/sbin/munged "$sinfo" "$scontrol"; do
    [ -x "$b" ] || die "$b not found$([ "$prefix" = /usr ] && echo " after install" || echo " (tests/slurm/build_slurm.sh)")"
done
other_slurm_running && die "another Slurm's daemons are running; stop them first (tests/slurm/teardown_cluster.sh)"

# --- munge key --------------------------------------------------------------------
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    say "creating /etc/munge/munge.key"
    if [ -x /usr/sbin/mungekey ]; then
        /usr/sbin/mungekey --create --keyfile=/etc/munge/munge.key --force
    else
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key

# --- fake GPUs --------------------------------------------------------------------
for n in 0 1 2 3; do
    dev="/dev/nvidia$n"
    if [ ! -e "$dev" ]; then
        mknod -m 0666 "$dev" c 195 "$n" || die "mknod $dev failed (container without CAP_MKNOD?)"
    fi
    [ -c "$dev" ] || die "$dev exists but is not a character device"
done

# --- configuration ----------------------------------------------------------------
install -d -m 0755 "$conf_dir" "$log_dir" "$state_dir" "$spool_dir" "$run_dir" /etc/jobsight
# At least 4 CPUs so four 1-GPU jobs fit at once on a 2-core CI runner
# (slurm.conf has SlurmdParameters=config_overrides; nothing is pinned with task/none).
cpus="$(nproc)"
[ "$cpus" -ge 4 ] || cpus=4
changed=0
render() {  # render TEMPLATE DEST MODE: write only when the content differs
    local tmp
    tmp="$(mktemp)"
    sed -e "s|@HOST@|$host|g" -e "s|@SLURM_DIR@|$slurm_dir|g" -e "s|@CPUS@|$cpus|g" \
        -e "s|@STATE_DIR@|$state_dir|g" -e "s|@SPOOL_DIR@|$spool_dir|g" -e "s|@LOG_DIR@|$log_dir|g" \
        -e "s|@RUN_DIR@|$run_dir|g" "$1" >"$tmp"
    if ! cmp -s "$tmp" "$2"; then
        install -m "$3" "$tmp" "$2"
        changed=1
        say "wrote $2"
    fi
    rm -f "$tmp"
}
render "$here/slurm.conf.in" "$conf_dir/slurm.conf" 0644
render "$here/gres.conf.in" "$conf_dir/gres.conf" 0644
render "$here/cgroup.conf.in" "$conf_dir/cgroup.conf" 0644

hooks_env=/etc/jobsight/hooks.env
# JOBSIGHT_BIN: the caller's, else this checkout's venv, else what an earlier run wrote.
if [ -z "${JOBSIGHT_BIN:-}" ] && [ -x "$repo/.venv/bin/jobsight" ]; then
    JOBSIGHT_BIN="$repo/.venv/bin/jobsight"
fi
if [ -z "${JOBSIGHT_BIN:-}" ] && [ -f "$hooks_env" ] && grep -qxF "$marker" "$hooks_env"; then
    JOBSIGHT_BIN="$(sed -n 's/^JOBSIGHT_BIN=//p' "$hooks_env" | tail -n1)"
fi
JOBSIGHT_BIN="${JOBSIGHT_BIN:-/usr/local/bin/jobsight}"
if [ ! -e "$hooks_env" ] || grep -qxF "$marker" "$hooks_env"; then
    tmp="$(mktemp)"
    {
        echo "$marker"
        echo "JOBSIGHT_BIN=$JOBSIGHT_BIN"
        # A Slurm outside /usr: the hooks ask its squeue, with its configuration (slurmd's SLURM_CONF).
        if [ "$prefix" != /usr ]; then
            echo "JOBSIGHT_SQUEUE=$squeue"
            echo "SLURM_CONF=$conf_dir/slurm.conf"
        fi
        for v in JOBSIGHT_URL JOBSIGHT_CONFIG JOBSIGHT_HOOK_TIMEOUT JOBSIGHT_CLUSTER JOBSIGHT_NODE \
                 JOBSIGHT_SECRET_FILE JOBSIGHT_TOKEN_DIR JOBSIGHT_REGISTRATION_DIR JOBSIGHT_SPOOL_DIR JOBSIGHT_HOOK_LOG; do
            [ -z "${!v:-}" ] || echo "$v=${!v}"
        done
    } >"$tmp"
    cmp -s "$tmp" "$hooks_env" || { install -o root -g root -m 0644 "$tmp" "$hooks_env"; say "wrote $hooks_env (JOBSIGHT_BIN=$JOBSIGHT_BIN)"; }
    rm -f "$tmp"
else
    say "keeping $hooks_env (not written by this script)"
fi
[ -x "$JOBSIGHT_BIN" ] || say "warning: $JOBSIGHT_BIN is not executable yet; the hooks will skip jobsight and jobs still run"
if [ -x "$JOBSIGHT_BIN" ]; then
    traversable "$JOBSIGHT_BIN"
    interpreter="$(sed -n '1s/^#![[:space:]]*\([^[:space:]]*\).*/\1/p' "$JOBSIGHT_BIN")"
    [ -n "$interpreter" ] && [ -e "$interpreter" ] && traversable "$(readlink -f "$interpreter")"
fi

slurmd_started=0  # epoch seconds when this run (re)started slurmd
# --- daemons ----------------------------------------------------------------------
alive() {  # alive PIDFILE NAME: the pid file names a running process called NAME
    local pid
    [ -s "$1" ] || return 1
    pid="$(cat "$1")"
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]
}
stop() {  # stop PIDFILE NAME
    local pid
    alive "$1" "$2" || return 0
    pid="$(cat "$1")"
    kill "$pid"
    for _ in $(seq 50); do
        [ -d "/proc/$pid" ] || return 0
        sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true
}

if [ "$prefix" = /usr ] && [ -d /run/systemd/system ]; then
    # A booted systemd host (e.g. a CI VM): the Debian units own the daemons.
    # (Untested in the container this was written in; see NOTES.md.)
    systemctl enable --now munge >/dev/null
    if [ "$changed" -eq 1 ] || ! systemctl is-active -q slurmd; then
        slurmd_started="$(date +%s)"
    fi
    if [ "$changed" -eq 1 ]; then systemctl restart slurmctld slurmd
    else systemctl start slurmctld slurmd; fi
else
    if ! alive /run/munge/munged.pid munged; then
        say "starting munged"
        runuser -u munge -- /usr/sbin/munged || die "munged failed to start; see /var/log/munge/munged.log"
    fi
    for _ in $(seq 25); do
        munge -n </dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.2
    done
    munge -n </dev/null | unmunge >/dev/null 2>&1 || die "munge round trip failed; see /var/log/munge/munged.log"

    if [ "$changed" -eq 1 ]; then
        stop "$run_dir/slurmd.pid" slurmd
        stop "$run_dir/slurmctld.pid" slurmctld
    fi
    if ! alive "$run_dir/slurmctld.pid" slurmctld; then
        say "starting $slurmctld"
        "$slurmctld" || die "slurmctld failed to start; see $log_dir/slurmctld.log"
    fi
    if ! alive "$run_dir/slurmd.pid" slurmd; then
        say "starting $slurmd"
        slurmd_started="$(date +%s)"
        "$slurmd" || die "slurmd failed to start; see $log_dir/slurmd.log"
    fi
fi

# --- wait for the node ------------------------------------------------------------
# slurmctld restores the node's last state from /var/spool/slurmctld, so "idle" alone
# can predate the new slurmd; also wait until slurmd has registered since we started it.
registered() {
    local t
    [ "$slurmd_started" -eq 0 ] && return 0
    t="$("$scontrol" show node "$host" 2>/dev/null | sed -n 's/.*SlurmdStartTime=\([^ ]*\).*/\1/p')"
    [ -n "$t" ] && [ "$t" != None ] && [ "$(date -d "$t" +%s 2>/dev/null || echo 0)" -ge $((slurmd_started - 1)) ]
}
state=""
resumed=0
for _ in $(seq $((wait_s * 2))); do
    state="$("$sinfo" -h -n "$host" -o %T 2>/dev/null | head -n1 || true)"
    case "$state" in
        idle|mixed|allocated) registered && break ;;
        down*|drain*)
            # A node left down/drained by an earlier run (e.g. a killed prolog) comes back.
            if [ "$resumed" -eq 0 ]; then
                "$scontrol" update NodeName="$host" State=RESUME >/dev/null 2>&1 || true
                resumed=1
            fi ;;
    esac
    sleep 0.5
done
case "$state" in
    idle|mixed|allocated) registered || { state="$state, slurmd not registered"; false; } ;;
    *) false ;;
esac || {
    echo "--- sinfo -R" >&2; "$sinfo" -R >&2 || true
    echo "--- slurmctld.log (tail)" >&2; tail -n 20 "$log_dir/slurmctld.log" >&2 2>/dev/null || true
    echo "--- slurmd.log (tail)" >&2; tail -n 20 "$log_dir/slurmd.log" >&2 2>/dev/null || true
    die "node $host not ready after ${wait_s}s (state: ${state:-unknown})"
}
say "node $host is $state; $("$sinfo" -h -n "$host" -o '%G' 2>/dev/null) ready on $("$sinfo" -V 2>/dev/null) (hooks in $slurm_dir)"
