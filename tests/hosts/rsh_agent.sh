#!/bin/bash
# Simulated hosts for tests: OpenMPI's rsh launcher calls this script in place of ssh, as
#
#     rsh_agent.sh [ssh options] HOST orted ARGS...
#
# and it runs HOST's daemon (orted, and so every rank on HOST) on the local machine in its own UTS and
# mount namespaces: its own host name and its own empty temporary directory (TMPDIR, or /tmp), as if
# HOST were another node.
#
# Environment (all optional):
#   MEMDIAG_SIM_LAUNCH_HOST  the simulated host that plays the launching host: it alone sees
#   MEMDIAG_SIM_RUN_ROOT     this directory (run directories); every other host gets an empty one,
#                            so nothing can pass between hosts through the file system
#   MEMDIAG_SIM_REPORT       a directory where, once HOST's daemon has exited, the entries it left
#                            in its temporary directory are listed (file HOST-PID.tmp-left), the
#                            directory itself vanishing with the namespace
#
# mpirun must run with tree spawn off (plm_rsh_no_tree_spawn=1): a daemon inside a namespace would
# otherwise start the next ones inside it. This script, the Python environment and the run directory
# must not lie under the temporary directory, which every simulated host masks.
set -u

# OpenMPI passes no ssh options by default; skip any that a configuration adds (-x, -q, ...).
while [[ $# -gt 0 && "$1" == -* ]]; do shift; done
host=$1
shift
# The command is meant for a remote shell: one string, re-parsed there (OpenMPI quotes some values).
# orted would fork into the background; it stays in the foreground so that this script outlives it
# and can see what it left behind.
command=$*
command=${command/--daemonize/}

exec unshare --uts --mount /bin/bash -c '
    host=$1
    command=$2
    hostname "$host" || exit 1
    tmp=${TMPDIR:-/tmp}
    mount -t tmpfs memdiag-sim-tmp "$tmp" || exit 1
    if [[ -n "${MEMDIAG_SIM_RUN_ROOT:-}" && "$host" != "${MEMDIAG_SIM_LAUNCH_HOST:-}" ]]; then
        mount -t tmpfs memdiag-sim-hidden "$MEMDIAG_SIM_RUN_ROOT" || exit 1
    fi
    /bin/sh -c "$command"
    status=$?
    if [[ -n "${MEMDIAG_SIM_REPORT:-}" ]]; then
        ls -A "$tmp" > "$MEMDIAG_SIM_REPORT/$host-$$.tmp-left"
    fi
    exit $status
' rsh_agent "$host" "$command"
