#!/usr/bin/env bash
# cluster.sh: a real single-node SLURM for the tests: munged, slurmctld and slurmd with all their state in one
# directory, started once per ctest run (fixture setup) and stopped afterwards (fixture cleanup).
#   cluster.sh start STATE_DIR    writes STATE_DIR/env.sh (SLURM_CONF=...), or STATE_DIR/unavailable + exit 77
#   cluster.sh stop STATE_DIR     scontrol shutdown, munged --stop (by socket and pid file, never by name)
# The node looks like a 2-GPU V100 node (32 CPUs, 2 GPUs of type volta, no device files) so that the batch
# scripts run unchanged; mgrl itself runs on the CPU backend there.
set -euo pipefail
action=${1:?start or stop}
S=${2:?state directory}
MU=$S/munge

unavailable() {  # the one way to skip: what is missing cannot be had here
  mkdir -p "$S"
  echo "$*" > "$S/unavailable"
  echo "cluster.sh: SKIPPED: $*"
  exit 77
}

free_port() {  # a TCP port nobody listens on, from a range, starting at $1
  local p=$1
  while (echo > "/dev/tcp/127.0.0.1/$p") 2>/dev/null || (echo > "/dev/tcp/127.0.0.1/$((p + 1))") 2>/dev/null; do
    p=$((p + 2))
  done
  echo "$p"
}

if [ "$action" = stop ]; then
  if [ -f "$S/env.sh" ]; then
    # shellcheck disable=SC1091
    source "$S/env.sh"
    scontrol shutdown >/dev/null 2>&1 || true
    for f in "$S/slurmctld.pid" "$S/slurmd.pid"; do  # wait for both to be gone (pid files name them)
      for _ in $(seq 50); do
        [ -f "$f" ] && kill -0 "$(cat "$f" 2>/dev/null)" 2>/dev/null || break
        sleep 0.2
      done
      if [ -f "$f" ] && kill -0 "$(cat "$f" 2>/dev/null)" 2>/dev/null; then kill "$(cat "$f")" 2>/dev/null || true; fi
    done
  fi
  if [ -S "$MU/munge.socket.2" ]; then munged --stop --socket="$MU/munge.socket.2" >/dev/null 2>&1 || true; fi
  echo "cluster.sh: stopped the test SLURM of $S"
  exit 0
fi

[ "$action" = start ] || { echo "cluster.sh: unknown action '$action'" >&2; exit 2; }
rm -rf "$S"
mkdir -p "$S"
for c in munged mungekey slurmctld slurmd sbatch srun scontrol squeue scancel; do
  command -v "$c" >/dev/null 2>&1 ||
    unavailable "'$c' is not installed (Debian: apt-get install slurm-wlm slurmctld slurmd slurm-client munge; scripts/install_deps.sh does it)"
done
[ "$(id -u)" = 0 ] || unavailable "the test SLURM runs slurmd as root, and this is not root"

# munge: a fresh key and a private socket.
mkdir -p "$MU"
chmod 0755 "$MU"
mungekey --create --keyfile="$MU/munge.key" >/dev/null 2>&1 || mungekey -c -k "$MU/munge.key"
chmod 0600 "$MU/munge.key"
munged --socket="$MU/munge.socket.2" --key-file="$MU/munge.key" --pid-file="$MU/munged.pid" \
       --log-file="$MU/munged.log" --seed-file="$MU/munged.seed"

H=$(hostname -s)
ctl_port=$(free_port 16817)
d_port=$((ctl_port + 1))
mkdir -p "$S/state" "$S/spool" "$S/tmp"
cat > "$S/slurm.conf" <<CONF
# The test SLURM of $S (tests/slurm/cluster.sh).
ClusterName=mgrltest
SlurmctldHost=$H(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MU/munge.socket.2
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
TmpFS=$S/tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=pmix
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=600
KillWait=5
GresTypes=gpu
NodeName=$H NodeAddr=127.0.0.1 CPUs=32 RealMemory=190000 Gres=gpu:volta:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
mkdir -p "$S/dev"
touch "$S/dev/nvidia0" "$S/dev/nvidia1"
cat > "$S/gres.conf" <<CONF
# Two GPUs whose "device files" are empty files: the node is a V100 node to the scheduler only.
NodeName=$H Name=gpu Type=volta File=$S/dev/nvidia[0-1]
CONF
echo "export SLURM_CONF=$S/slurm.conf" > "$S/env.sh"
export SLURM_CONF=$S/slurm.conf
slurmctld
slurmd
# Ready when the node is idle.
for _ in $(seq 100); do
  state=$(sinfo -h -n "$H" -o %t 2>/dev/null || true)
  case $state in idle) break ;; inval* | drain* | down*) break ;; esac
  sleep 0.2
done
if [ "$state" != idle ]; then
  echo "cluster.sh: the node did not become idle (state '$state')" >&2
  tail -n 20 "$S/slurmctld.log" "$S/slurmd.log" >&2 || true
  exit 1
fi
echo "cluster.sh: test SLURM up in $S (node $H idle, slurmctld port $ctl_port)"
