#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the Slurm test tier (make test-slurm) and for trying
# memdiag under srun/sbatch/salloc by hand:
#
#   scripts/slurm_local.sh start    # install slurm-wlm and munge if missing, write the config, start the daemons
#   scripts/slurm_local.sh stop     # stop slurmd, slurmctld and munged by their pid files
#   scripts/slurm_local.sh env      # print `export SLURM_CONF=...` for the client commands
#
# Everything it writes lies in $MEMDIAG_SLURM_DIR (default /var/tmp/memdiag-slurm): slurm.conf, the
# daemons' state, logs and pid files; munged's key, socket and pid file are munge's own (/etc/munge,
# /run/munge). The client commands (srun, sbatch, salloc, squeue) need SLURM_CONF=$MEMDIAG_SLURM_DIR/slurm.conf.
# Needs root (the daemons run as root; munged as its own user). Configuration facts: /work/shared/DESIGN.md
# (select/cons_tres with CR_CPU, the node's CPUs from nproc, MpiDefault=none: jobs ask for --mpi=pmix).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${MEMDIAG_SLURM_DIR:-/var/tmp/memdiag-slurm}"
CONF="$DIR/slurm.conf"
MUNGE_PID=/run/munge/munged.pid
SETUP_TAG=slurm
# shellcheck source=scripts/retry.sh
source "$ROOT/scripts/retry.sh"  # retry CMD...: up to 3 tries

say() { printf '[slurm] %s\n' "$*"; }
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
            && command -v srun >/dev/null; then
        return
    fi
    say "installing slurm-wlm and munge from Debian's packages"
    retry $SUDO apt-get update -qq
    retry env DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_config() {
    local node cpus memory
    node="$(hostname -s)"
    cpus="$(nproc)"
    # Slurm refuses a node that reports less memory than configured: give it what the kernel says, in MiB.
    memory="$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)"
    mkdir -p "$DIR/state" "$DIR/spool"
    cat >"$CONF" <<EOF
# Written by scripts/slurm_local.sh: one node, this machine.
ClusterName=memdiag
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
# No cgroups: the tests run in containers where Slurm cannot manage them; processes are tracked by
# their parent ids, which is also how a step's signals reach every process of a task.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
# Seconds between a job's SIGTERM and its SIGKILL (scancel, time limit): the ranks' grace to write.
KillWait=10
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
}

alive() {  # alive PIDFILE: the process named by the pid file runs
    [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

start_munge() {
    if alive "$MUNGE_PID"; then return; fi
    if [ ! -s /etc/munge/munge.key ]; then
        $SUDO mungekey -c -k /etc/munge/munge.key
    fi
    $SUDO chown munge:munge /etc/munge/munge.key
    $SUDO chmod 400 /etc/munge/munge.key
    $SUDO mkdir -p /run/munge /var/log/munge /var/lib/munge
    $SUDO chown munge:munge /run/munge /var/log/munge /var/lib/munge
    $SUDO runuser -u munge -- /usr/sbin/munged
}

wait_for_node() {
    local i
    for i in $(seq 1 120); do
        if SLURM_CONF="$CONF" sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
            return 0
        fi
        sleep 0.25
    done
    say "the node did not come up within 30 s; see $DIR/slurmctld.log and $DIR/slurmd.log"
    return 1
}

start() {
    local t0
    t0=$(date +%s.%N)
    install
    local t1
    t1=$(date +%s.%N)
    write_config
    start_munge
    if ! alive "$DIR/slurmctld.pid"; then
        # -i: ignore state left by an earlier cluster in $DIR (its jobs are gone with its daemons).
        $SUDO slurmctld -f "$CONF" -i
    fi
    if ! alive "$DIR/slurmd.pid"; then
        $SUDO slurmd -f "$CONF"
    fi
    wait_for_node
    local t2
    t2=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v c="$t2" -v conf="$CONF" \
        'BEGIN { printf "[slurm] up: install %.1f s, start %.1f s; export SLURM_CONF=%s\n", b - a, c - b, conf }'
}

stop_one() {  # stop_one NAME PIDFILE
    local pid i
    [ -f "$2" ] || return 0
    pid="$(cat "$2")"
    if kill -0 "$pid" 2>/dev/null; then
        $SUDO kill -TERM "$pid"
        for i in $(seq 1 40); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "$1 ($pid) did not stop in 10 s; killing it"
            $SUDO kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    $SUDO rm -f "$2"
}

stop() {
    stop_one slurmd "$DIR/slurmd.pid"
    stop_one slurmctld "$DIR/slurmctld.pid"
    stop_one munged "$MUNGE_PID"
    say "stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
