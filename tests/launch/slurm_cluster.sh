# A throwaway single-node Slurm cluster on 127.0.0.1 (sourced by tests/launch/slurm_live.sh):
# munged, slurmctld and slurmd from Debian's packages, every file under one folder (its own
# slurm.conf, munge key, spool and state dirs, logs), free TCP ports, nothing in /etc touched.
#   slurm_cluster_start DIR CPUS   starts the daemons, exports SLURM_CONF and waits for the node
#   slurm_cluster_stop             cancels every job, stops the daemons, kills what is left of
#                                  the cluster's processes; returns 1 if anything survived
# The daemons run as root (Slurm's SlurmUser/SlurmdUser): slurm_cluster_start returns 77 with a
# message when this is not root or a daemon is missing.

SLURM_DIR=""

# free_port: a TCP port on 127.0.0.1 nobody listens on (asked from the kernel).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

slurm_cluster_start() {
  local dir=$1 cpus=$2 d
  for d in munged slurmctld slurmd sbatch srun squeue scancel; do
    command -v "$d" >/dev/null || { echo "SKIP: $d not installed (launch/install-deps.sh installs Slurm and munge)" >&2; return 77; }
  done
  [ "$(id -u)" -eq 0 ] || { echo "SKIP: slurmd must run as root to start jobs; this is uid $(id -u)" >&2; return 77; }
  SLURM_DIR=$dir
  mkdir -p "$dir"/{munge,state,spool,log,tmp}
  chmod 700 "$dir" "$dir/munge"
  # munged refuses group- or world-readable keys and sockets in shared folders.
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge/munge.key"
  # MLLM_TEST_CLUSTER marks the daemons and what they fork (slurmstepd) for slurm_cluster_stop.
  MLLM_TEST_CLUSTER=$dir munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed" || { echo "munged did not start:" >&2; cat "$dir/log/munged.log" >&2; return 1; }
  local ctld_port slurmd_port
  ctld_port=$(free_port); slurmd_port=$(free_port)
  local mem_mb
  mem_mb=$(awk '/MemTotal/ { print int($2 / 1024 / 2) }' /proc/meminfo)
  cat > "$dir/slurm.conf" <<EOF
# Written by tests/launch/slurm_cluster.sh: one node, 127.0.0.1 only, state under $dir.
ClusterName=mllmtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
# Job-private temporary files (PMIx's spmix_appdir_UID_JOB.STEP) here, not in /tmp: job ids
# restart at 1 in every test cluster.
TmpFS=$dir/tmp
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# The node has CPUs=N whatever this machine has (the test asks for N tasks).
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# Slurm checks time limits about every 30 s; a job over its limit is signalled, then killed after KillWait.
KillWait=20
OverTimeLimit=0
MinJobAge=600
InactiveLimit=0
NodeName=node1 NodeHostname=$(hostname) NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=test Nodes=node1 Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$dir/slurm.conf
  MLLM_TEST_CLUSTER=$dir slurmctld -f "$SLURM_CONF" || { cat "$dir/log/slurmctld.log" >&2; return 1; }
  MLLM_TEST_CLUSTER=$dir slurmd -f "$SLURM_CONF" -N node1 || { cat "$dir/log/slurmd.log" >&2; return 1; }
  local i state
  for i in $(seq 1 60); do
    state=$(sinfo -h -n node1 -o %t 2>/dev/null || true)
    case "$state" in idle|mix|alloc) return 0 ;; esac
    sleep 1
  done
  echo "the Slurm node did not come up (state '$state'); logs:" >&2
  tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2
  return 1
}

# cluster_pids: processes that belong to the cluster: daemons (marked with MLLM_TEST_CLUSTER),
# slurmstepd (which clears its environment; its working folder is the cluster's log folder) and
# jobs (SLURM_JOB_ID and this SLURM_CONF in their environment).
cluster_pids() {
  [ -n "$SLURM_DIR" ] || return 0
  local p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" != $$ ] || continue
    case "$(readlink "/proc/$p/cwd" 2>/dev/null)" in "$SLURM_DIR"/*) echo "$p"; continue ;; esac
    tr '\0' '\n' 2>/dev/null < "/proc/$p/environ" |
      awk -v m="MLLM_TEST_CLUSTER=$SLURM_DIR" -v c="SLURM_CONF=$SLURM_DIR/slurm.conf" '
        $0 == m { d = 1 } $0 == c { a = 1 } /^SLURM_JOB_ID=/ { b = 1 } END { exit !(d || (a && b)) }' &&
      echo "$p"
  done
  return 0
}

slurm_cluster_stop() {
  [ -n "$SLURM_DIR" ] || return 0
  # Jobs first, while slurmctld and slurmd can still end them (SIGTERM, KillWait, SIGKILL).
  scancel --user="$(id -un)" 2>/dev/null || true
  local i
  for i in $(seq 1 60); do
    [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
    sleep 0.5
  done
  local f
  for f in slurmctld.pid slurmd.pid munge/munged.pid; do
    [ -f "$SLURM_DIR/$f" ] && kill "$(cat "$SLURM_DIR/$f")" 2>/dev/null || true
  done
  local left
  for i in $(seq 1 20); do
    left=$(cluster_pids)
    [ -n "$left" ] || break
    [ "$i" -lt 10 ] || kill -9 $left 2>/dev/null || true
    sleep 0.5
  done
  left=$(cluster_pids)
  if [ -n "$left" ]; then
    echo "slurm_cluster_stop: still running:" >&2
    ps -o pid,args -p $left >&2 || true
    return 1
  fi
  SLURM_DIR=""
  return 0
}
