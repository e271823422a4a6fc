#!/bin/bash
# A real single-node SLURM cluster on this host, for the `slurm` tests (and for trying the sbatch
# scripts by hand): munge, slurmctld and slurmd from Debian's slurm-wlm and munge packages, their
# config, state and logs in DIR, stopped by the pids they wrote there.
#
#   scripts/slurm-local.sh start DIR    # prints `export SLURM_CONF=DIR/slurm.conf` once the node is idle
#   scripts/slurm-local.sh stop DIR
#
# The daemons run as the calling user (root in CI: SlurmUser root, munged --force), on ports found
# free at start. ProctrackType=linuxproc and TaskPlugin=none need no cgroups; JobRequeue=1 lets
# `scontrol requeue` put a job back in the queue with the same id.
set -euo pipefail

ACTION=${1:?usage: scripts/slurm-local.sh start|stop DIR}
DIR=${2:?usage: scripts/slurm-local.sh start|stop DIR}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)

stop() {
    for pidfile in "$DIR"/slurmd.pid "$DIR"/slurmctld.pid "$DIR"/munged.pid; do
        if [ -s "$pidfile" ]; then
            kill "$(cat "$pidfile")" 2>/dev/null || true
        fi
    done
    for pidfile in "$DIR"/slurmd.pid "$DIR"/slurmctld.pid "$DIR"/munged.pid; do
        for _ in $(seq 50); do
            if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then sleep 0.1; else break; fi
        done
        rm -f "$pidfile"
    done
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

if [ "$ACTION" = stop ]; then
    stop
    exit 0
fi
if [ "$ACTION" != start ]; then
    echo "scripts/slurm-local.sh: unknown action $ACTION (start or stop)" >&2
    exit 2
fi
for daemon in munged slurmctld slurmd sbatch; do
    if ! command -v "$daemon" >/dev/null && [ ! -x "/usr/sbin/$daemon" ]; then
        echo "scripts/slurm-local.sh: $daemon not found: apt-get install slurm-wlm munge" >&2
        exit 3
    fi
done
export PATH="$PATH:/usr/sbin"

HOST=$(hostname -s)
USER_NAME=$(id -un)
CPUS=$(nproc)
MEMORY=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024))
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/munge"
chmod 700 "$DIR/munge"
if [ ! -s "$DIR/munge/munge.key" ]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$DIR/munge/munge.key"
fi
SOCKET="$DIR/munge/munge.socket"
munged --force --key-file="$DIR/munge/munge.key" --socket="$SOCKET" --pid-file="$DIR/munged.pid" \
    --log-file="$DIR/munged.log" --seed-file="$DIR/munge/munge.seed"

cat >"$DIR/slurm.conf" <<EOF
ClusterName=splitlab
SlurmctldHost=$HOST
SlurmUser=$USER_NAME
SlurmdUser=$USER_NAME
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobRequeue=1
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
KillWait=20
InactiveLimit=0
MinJobAge=600
NodeName=$HOST CPUs=$CPUS RealMemory=$MEMORY State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

export SLURM_CONF="$DIR/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 120); do
    if sinfo -h -o %T 2>/dev/null | grep -qE '^idle'; then
        echo "export SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.5
done
echo "scripts/slurm-local.sh: the node did not come up within 60 s (logs in $DIR)" >&2
stop
exit 4
