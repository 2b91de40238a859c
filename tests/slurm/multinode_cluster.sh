#!/usr/bin/env bash
# multinode_cluster.sh: a real SLURM of 3 hosts on this machine for the multi-node tests: each node a network
# namespace with its own hostname (UTS namespace), address on a bridge (veth pair), /tmp for SLURM and slurmd;
# slurmctld and munged in the root namespace. Every daemon is recorded by its pid and stopped by it.
#   multinode_cluster.sh start STATE_DIR   writes STATE_DIR/env.sh, or STATE_DIR/unavailable + exit 77 (skip)
#   multinode_cluster.sh stop STATE_DIR    stops what STATE_DIR records: daemons by pid, namespaces, links, bridge
#   multinode_cluster.sh node-kill STATE_DIR NODE   SIGKILL to every process of NODE's namespace (slurmd, its
#                                                   slurmstepds, the job's ranks): the node is lost
#   multinode_cluster.sh node-start STATE_DIR NODE  starts NODE's slurmd again (the node is back)
#   multinode_cluster.sh link-down|link-up STATE_DIR NODE   cuts / restores NODE's network link
#   multinode_cluster.sh leftovers STATE_DIR NODE   names the processes of NODE's namespace other than its slurmd
# Names carry a prefix and this cluster's id (mgmn<id>...), so that two test sessions never collide; a start first
# removes what a killed earlier session left behind (only names of this prefix whose recorded daemons are gone).
# A watcher process ends the cluster when the process that started it (ctest) ends without stopping it.
set -euo pipefail
action=${1:?start, stop, node-kill, node-start, link-down, link-up or leftovers}
S=${2:?state directory}
NODES=(n1 n2 n3)
REG=/run/mgrl-multinode   # one file per live cluster: its state directory (for stale detection by other sessions)

unavailable() {  # the one way to skip: what is missing or refused cannot be had here
  mkdir -p "$S"
  echo "$*" > "$S/unavailable"
  echo "multinode_cluster.sh: SKIPPED: $*"
  exit 77
}
log() { echo "multinode_cluster.sh: $*"; }
alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
pidof_file() { [ -f "$1" ] && cat "$1" 2>/dev/null || true; }

# kill_wait PID...: SIGTERM, then SIGKILL after 5 s, for each pid still alive.
kill_wait() {
  local p
  for p in "$@"; do alive "$p" && kill "$p" 2>/dev/null || true; done
  for _ in $(seq 25); do
    local any=0
    for p in "$@"; do alive "$p" && any=1; done
    [ $any = 0 ] && return 0
    sleep 0.2
  done
  for p in "$@"; do alive "$p" && kill -9 "$p" 2>/dev/null || true; done
}

# netns_kill NS [KEEP_PID]: SIGKILL to every process in the namespace NS (ip netns pids), except KEEP_PID.
netns_kill() {
  local ns=$1 keep=${2:-} p
  for _ in 1 2 3; do
    local pids=()
    for p in $(ip netns pids "$ns" 2>/dev/null); do [ "$p" != "$keep" ] && pids+=("$p"); done
    [ ${#pids[@]} = 0 ] && return 0
    kill -9 "${pids[@]}" 2>/dev/null || true
    sleep 0.2
  done
}

# teardown ID DIR: everything of cluster ID (state in DIR, which may be gone): daemons, namespaces, links, bridge.
teardown() {
  local id=$1 dir=$2 n ns
  if [ -f "$dir/env.sh" ] && alive "$(pidof_file "$dir/slurmctld.pid")"; then
    SLURM_CONF=$dir/slurm.conf timeout 10 scontrol shutdown >/dev/null 2>&1 || true
  fi
  local pids=()
  for f in "$dir"/slurmctld.pid "$dir"/slurmd-*.pid "$dir"/munge/munged.pid; do
    [ -f "$f" ] && pids+=("$(cat "$f" 2>/dev/null)")
  done
  [ ${#pids[@]} -gt 0 ] && kill_wait "${pids[@]}"
  for n in "${NODES[@]}"; do
    ns=mgmn$id-$n
    if [ -e "/var/run/netns/$ns" ]; then
      netns_kill "$ns"  # slurmstepds and ranks left in the node (a cut link leaves them behind)
      ip netns del "$ns" 2>/dev/null || true
    fi
    ip link del "mgmn${id}v$n" 2>/dev/null || true
  done
  ip link del "mgmn${id}br" 2>/dev/null || true
  rm -f "$REG/$id"
}

# The cluster of this state directory, if any (ID recorded at start).
own_id() { cat "$S/id" 2>/dev/null || true; }

# remove_stale: clusters of this prefix whose daemons are all gone (a session killed before its stop), and the
# cluster this state directory recorded (a killed earlier run of the same build tree).
remove_stale() {
  local id
  id=$(own_id)
  [ -n "$id" ] && { log "removing the earlier cluster $id of $S"; teardown "$id" "$S"; }
  local seen=" " name dir live
  for name in $(ip -o link show 2>/dev/null | sed -n 's/^[0-9]*: \(mgmn[0-9a-f]*\)br[:@].*/\1/p') \
              $(ip netns list 2>/dev/null | sed -n 's/^\(mgmn[0-9a-f]*\)-n[0-9].*/\1/p'); do
    id=${name#mgmn}
    [[ $seen == *" $id "* ]] && continue
    seen+="$id "
    dir=$(cat "$REG/$id" 2>/dev/null || true)
    live=0
    if [ -n "$dir" ]; then
      for f in "$dir"/slurmctld.pid "$dir"/munge/munged.pid "$dir"/watcher.pid; do
        alive "$(pidof_file "$f")" && live=1
      done
    fi
    if [ $live = 0 ]; then log "removing stale cluster $id (${dir:-no state directory})"; teardown "$id" "${dir:-/nonexistent}"; fi
  done
}

node_ns() { echo "mgmn$(own_id)-$1"; }

# start_slurmd NODE: slurmd in NODE's network namespace, with its own hostname, TmpFS directory and /dev/shm.
start_slurmd() {
  local n=$1 ns
  ns=$(node_ns "$n")
  rm -f "$S/slurmd-$n.pid"
  SLURM_CONF=$S/slurm.conf nsenter --net="/var/run/netns/$ns" unshare --uts --mount --propagation private \
    sh -c "mount --bind '$S/tmp-$n' '$S/tmp' && mount --bind '$S/shm-$n' /dev/shm && hostname $n && exec slurmd -N $n"
}

case $action in
  stop)
    id=$(own_id)
    [ -n "$id" ] || { log "nothing recorded in $S"; exit 0; }
    w=$(pidof_file "$S/watcher.pid")
    if alive "$w" && [ "$w" != "$PPID" ] && [ "$w" != "$$" ]; then kill "$w" 2>/dev/null || true; fi
    teardown "$id" "$S"
    rm -f "$S/id" "$S/env.sh"
    log "stopped cluster $id of $S"
    exit 0 ;;
  node-kill)
    n=${3:?node}
    netns_kill "$(node_ns "$n")"
    log "killed every process of node $n (slurmd, slurmstepd, ranks)"
    exit 0 ;;
  leftovers)
    n=${3:?node}
    keep=$(pidof_file "$S/slurmd-$n.pid")
    left=""
    for p in $(ip netns pids "$(node_ns "$n")" 2>/dev/null || true); do
      [ "$p" = "$keep" ] && continue
      comm=$(cat "/proc/$p/comm" 2>/dev/null || true)  # empty: it has just ended
      [ -n "$comm" ] && left+="${left:+, }$comm (pid $p)"
    done
    echo "$left"
    exit 0 ;;
  node-start)
    n=${3:?node}
    # As after a reboot: nothing of the node's earlier processes is left in its /tmp and spool directory. A killed
    # slurmstepd leaves its PMIx socket and directory (spool/stepd.slurm.pmix.JOB.STEP, spool/pmix.JOB.STEP), which
    # slurmd does not remove, and the step of the same id in the requeued job then fails on that node ("Cannot bind()
    # UNIX socket ...: Address already in use", "Cannot create directory .../pmix.JOB.STEP/: File exists").
    if [ -z "$(ip netns pids "$(node_ns "$n")" 2>/dev/null)" ]; then
      rm -rf "${S:?}/tmp-$n/"* "$S/shm-$n/"* "$S/spool-$n"/stepd.slurm.pmix.* "$S/spool-$n"/pmix.*
    fi
    start_slurmd "$n"
    log "slurmd of node $n started again"
    exit 0 ;;
  link-down | link-up)
    n=${3:?node}
    ip -n "$(node_ns "$n")" link set eth0 "${action#link-}"
    log "link of node $n ${action#link-}"
    exit 0 ;;
  start) ;;
  *) echo "multinode_cluster.sh: unknown action '$action'" >&2; exit 2 ;;
esac

# ---- start ----
for c in munged mungekey slurmctld slurmd sbatch srun scontrol sinfo ip nsenter unshare; do
  command -v "$c" >/dev/null 2>&1 ||
    unavailable "'$c' is not installed (Debian: slurm-wlm slurmctld slurmd slurm-client munge iproute2 util-linux; scripts/install_deps.sh installs them)"
done
[ "$(id -u)" = 0 ] || unavailable "the multi-node test cluster needs root (network namespaces, slurmd), and this is not root"
mkdir -p "$REG"
remove_stale
rm -rf "$S"
mkdir -p "$S"

# Can this kernel give us namespaces and a bridge? Try, and say what refused.
id=$(printf '%04x%04x' $((RANDOM)) $(($$ & 0xffff)))
probe=mgmn$id-probe
if ! err=$(ip netns add "$probe" 2>&1); then unavailable "the kernel refuses network namespaces (ip netns add: $err)"; fi
ip netns del "$probe" 2>/dev/null || true
if ! err=$(unshare --uts --mount true 2>&1); then unavailable "the kernel refuses UTS/mount namespaces (unshare: $err)"; fi
if ! err=$(ip link add "mgmn${id}br" type bridge 2>&1); then unavailable "the kernel refuses a bridge (ip link add type bridge: $err)"; fi

echo "$id" > "$S/id"
echo "$S" > "$REG/$id"
# From here on a failed start removes everything it made.
trap 'rc=$?; if [ $rc != 0 ] && [ $rc != 77 ]; then log "start failed: removing cluster $id"; for f in "$S"/slurmctld.log "$S"/slurmd-*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done; teardown "$id" "$S"; rm -f "$S/id"; fi' EXIT

# A /24 that no interface of this machine uses: 10.78.X.0.
used=$(ip -o -4 addr show | awk '{print $4}')
sub=""
for x in $(seq $((RANDOM % 200 + 20)) 250) $(seq 20 250); do
  grep -q "^10\.78\.$x\." <<< "$used" || { sub=10.78.$x; break; }
done
[ -n "$sub" ] || { echo "no free 10.78.X.0/24" >&2; exit 1; }
br=mgmn${id}br
ip addr add "$sub.1/24" dev "$br"
ip link set "$br" up
addr_of() { case $1 in n1) echo "$sub.11" ;; n2) echo "$sub.12" ;; n3) echo "$sub.13" ;; esac; }
for n in "${NODES[@]}"; do
  ns=mgmn$id-$n
  ip netns add "$ns"
  ip link add "mgmn${id}v$n" type veth peer name "mgmn${id}p$n"
  ip link set "mgmn${id}v$n" master "$br" up
  ip link set "mgmn${id}p$n" netns "$ns"
  ip -n "$ns" link set "mgmn${id}p$n" name eth0
  ip -n "$ns" addr add "$(addr_of "$n")/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" route add default via "$sub.1"
done

# munge: a fresh key and a private socket (a file: every namespace reaches it).
MU=$S/munge
mkdir -p "$MU"
chmod 0755 "$MU"
mungekey --create --keyfile="$MU/munge.key" >/dev/null 2>&1 || mungekey -c -k "$MU/munge.key"
chmod 0600 "$MU/munge.key"
munged --socket="$MU/munge.socket.2" --key-file="$MU/munge.key" --pid-file="$MU/munged.pid" \
       --log-file="$MU/munged.log" --seed-file="$MU/munged.seed"

H=$(hostname -s)
# Two free TCP ports (slurmctld listens in this namespace, the slurmds on the nodes' addresses).
ctl_port=$((17000 + RANDOM % 2000 * 2))
while (echo > "/dev/tcp/127.0.0.1/$ctl_port") 2>/dev/null || (echo > "/dev/tcp/127.0.0.1/$((ctl_port + 1))") 2>/dev/null; do
  ctl_port=$((ctl_port + 2))
done
d_port=$((ctl_port + 1))
mkdir -p "$S/state" "$S/tmp" "$S/dev"
for n in "${NODES[@]}"; do mkdir -p "$S/spool-$n" "$S/tmp-$n" "$S/shm-$n"; touch "$S/dev/$n-nvidia"{0,1,2,3}; done
# The epilog of every job on every node, as sites have one: Open MPI's shared-memory segments of ranks that did not
# reach MPI_Finalize (aborted, killed) stay in /dev/shm (seen here: vader_segment.n2.*), named after the host and Open
# MPI's job id, which follows the SLURM job and step ids that a requeued job reuses. The node's /dev/shm is its own
# (a bind mount in its namespace), as on separate machines.
cat > "$S/epilog.sh" <<'EPILOG'
#!/bin/sh
# epilog.sh: after each job, what an aborted Open MPI job leaves in this node's (private) /dev/shm.
rm -f /dev/shm/vader_segment.* /dev/shm/sm_segment.*
exit 0
EPILOG
chmod 0755 "$S/epilog.sh"
{
  echo "# The multi-node test SLURM of $S (tests/slurm/multinode_cluster.sh): nodes ${NODES[*]} on $sub.0/24."
  cat <<CONF
ClusterName=mgrlmn
SlurmctldHost=$H($sub.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MU/munge.socket.2
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool-%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd-%n.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd-%n.log
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
SlurmdTimeout=${MGRL_TEST_SLURMD_TIMEOUT:-20}
MessageTimeout=5
InactiveLimit=0
MinJobAge=600
KillWait=5
Epilog=$S/epilog.sh
GresTypes=gpu
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  for n in "${NODES[@]}"; do
    echo "NodeName=$n NodeAddr=$(addr_of "$n") CPUs=32 RealMemory=190000 Gres=gpu:volta:4 State=UNKNOWN"
  done
} > "$S/slurm.conf"
{
  echo "# Four GPUs per node whose \"device files\" are empty files: V100 nodes to the scheduler only."
  for n in "${NODES[@]}"; do echo "NodeName=$n Name=gpu Type=volta File=$S/dev/$n-nvidia[0-3]"; done
} > "$S/gres.conf"
cat > "$S/env.sh" <<ENV
export SLURM_CONF=$S/slurm.conf
# Open MPI between the nodes: TCP on the bridge's subnet only (shared memory stays within a node).
export OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_tcp_if_include=$sub.0/24
export OMPI_MCA_oob_tcp_if_include=$sub.0/24
# 3 nodes' ranks on the cores of one machine: a rank that waits must yield its core (srun does not tell Open MPI
# that the machine is oversubscribed, as mpirun does; spinning ranks made a step 20x slower).
export OMPI_MCA_mpi_yield_when_idle=1
export MGRL_TEST_SUBNET=$sub
ENV
export SLURM_CONF=$S/slurm.conf
slurmctld
for n in "${NODES[@]}"; do start_slurmd "$n"; done

# Ready when every node is idle.
want=${#NODES[@]}
for _ in $(seq 150); do
  idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
  [ "$idle" = "$want" ] && break
  sleep 0.2
done
if [ "$idle" != "$want" ]; then
  echo "multinode_cluster.sh: $idle of $want nodes idle:" >&2
  sinfo -N >&2 || true
  exit 1
fi

# The watcher: when the process that started the cluster (ctest, or a test's shell) is gone and the cluster is still
# recorded here, it stops it (a killed ctest leaves no daemons, namespaces or links behind).
owner=${MGRL_TEST_CLUSTER_OWNER:-$PPID}
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
setsid bash -c "while kill -0 $owner 2>/dev/null && [ -f '$S/id' ]; do sleep 1; done; [ -f '$S/id' ] && exec bash '$self' stop '$S'" \
  > "$S/watcher.log" 2>&1 < /dev/null &
echo $! > "$S/watcher.pid"
trap - EXIT
log "test SLURM up in $S: cluster $id, nodes ${NODES[*]} at $(addr_of n1)-$(addr_of n3) on bridge $br, slurmctld on $H:$ctl_port"
