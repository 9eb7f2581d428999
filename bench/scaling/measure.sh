#!/usr/bin/env bash
# The measurements behind docs/scaling.md, on this machine, into bench/scaling/data/ (small text
# files, committed so that `bench/scaling/run.sh --no-measure` redraws the doc without them):
#
#   allreduce.csv    mllm_bench_allreduce --which mllm: our mpi backend's all-reduce (float32 sum)
#                    at world sizes NP_LIST, 4 KiB..64 MiB by factors of 2, REPS rounds over all
#                    world sizes; seconds per call of the slowest rank
#   overlap_b25.txt  mllm_bench_overlap at np=2 with 25 MiB and 4 MiB buckets: the hidden fraction
#   overlap_b4.txt   of the gradient all-reduce behind backward
#   mini_np<N>.jsonl mllm-train recipes/mini.yaml for MINI_STEPS steps at N ranks x 1 thread
#                    (metrics.jsonl: forward/backward/comm/step ms per step), N in MINI_NP
#   machine.txt      what ran where: CPU, cores, OpenMPI, commit, date, load, quiet or not
#
#   bench/scaling/measure.sh [--build DIR]
# Environment: NP_LIST (default "2 3 4 5 6 7 8"), REPS (5), TARGET_MS (100), OVERLAP_ITERS (8),
# MINI_NP ("1 2 4 8"), MINI_STEPS (12), QUIET_WAIT_S (900: how long in all to wait for other
# jobs to leave the CPUs idle before each phase). About 5 minutes on the 2-vCPU dev VM when
# nothing else runs. World sizes above the core count run oversubscribed (--oversubscribe): the
# ranks then time-share the cores, which the fit models.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) [ $# -ge 2 ] || { echo "measure.sh: --build needs a folder" >&2; exit 2; }; BUILD="$2"; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "measure.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
  shift
done
NP_LIST="${NP_LIST:-2 3 4 5 6 7 8}"
REPS="${REPS:-5}"
OVERLAP_ITERS="${OVERLAP_ITERS:-8}"
TARGET_MS="${TARGET_MS:-100}"
MINI_NP="${MINI_NP:-1 2 4 8}"
MINI_STEPS="${MINI_STEPS:-12}"
DATA="$ROOT/bench/scaling/data"
for exe in bench/mllm_bench_allreduce bench/mllm_bench_overlap bin/mllm-train; do
  [ -x "$BUILD/$exe" ] || { echo "measure.sh: $BUILD/$exe not built (cmake --build $BUILD --target $(basename "$exe"))" >&2; exit 2; }
done
[ -f "$ROOT/data/full/tang.jsonl" ] || { echo "measure.sh: data/full/tang.jsonl missing (launch/fetch-corpus.sh)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "measure.sh: no mpirun on PATH" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
CORES=$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')  # before OMP_NUM_THREADS (nproc obeys it)
export OMP_NUM_THREADS=1
MPI=(mpirun --bind-to none --oversubscribe)

# The VM may be shared with other jobs, which slow and scatter the measurements: before each
# phase, wait (up to QUIET_WAIT_S, default 900 s in all) until the CPUs are >= 90% idle over 2 s.
QUIET_LEFT="${QUIET_WAIT_S:-900}"
idle_fraction() {
  python3 - <<'PY'
import time
def snap():
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return v[3] + v[4], sum(v)
i0, t0 = snap(); time.sleep(2); i1, t1 = snap()
print(f"{(i1 - i0) / max(1, t1 - t0):.2f}")
PY
}
wait_quiet() {
  local idle
  while :; do
    idle=$(idle_fraction)
    python3 -c "import sys; sys.exit(0 if $idle >= 0.9 else 1)" && return 0
    if [ "$QUIET_LEFT" -le 0 ]; then
      echo "measure.sh: warning: CPUs only $idle idle before '$1'; measuring anyway" >&2
      echo "busy before $1: idle $idle" >> "$WORK/busy.txt"
      return 0
    fi
    echo "measure.sh: CPUs $idle idle (another job?), waiting before '$1'" >&2
    sleep 10
    QUIET_LEFT=$((QUIET_LEFT - 12))
  done
}
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mllm-scaling.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$DATA"

echo "== all-reduce sweep: np in $NP_LIST, $REPS rounds (each round runs every np once)" >&2
# Rounds outside, world sizes inside: a change in the shared machine's speed during the sweep
# then hits every world size alike instead of biasing the later ones.
echo "impl,np,bytes,rep,iters,seconds" > "$WORK/allreduce.csv"
for rep in $(seq 0 $((REPS - 1))); do
  wait_quiet "all-reduce round $rep"
  for np in $NP_LIST; do
    "${MPI[@]}" -np "$np" "$BUILD/bench/mllm_bench_allreduce" --which mllm --min-bytes 4096 \
      --max-bytes 67108864 --factor 2 --target-ms "$TARGET_MS" --csv "$WORK/ar.csv" >&2
    tail -n +2 "$WORK/ar.csv" | awk -F, -v OFS=, -v rep="$rep" '{ $4 = rep; print }' >> "$WORK/allreduce.csv"
  done
done
mv "$WORK/allreduce.csv" "$DATA/allreduce.csv"

echo "== overlap, np=2 (d512/8-layer stand-in, batch 2 x 128, $OVERLAP_ITERS iterations)" >&2
for mb in 25 4; do
  wait_quiet "overlap, $mb MiB buckets"
  "${MPI[@]}" -np 2 "$BUILD/bench/mllm_bench_overlap" 8000 2 128 "$OVERLAP_ITERS" "$mb" | tee "$DATA/overlap_b$mb.txt" >&2
done

echo "== mini recipe, $MINI_STEPS steps at np in $MINI_NP (1 thread per rank)" >&2
for np in $MINI_NP; do
  wait_quiet "mini at np=$np"
  run=(env -C "$ROOT" "$BUILD/bin/mllm-train" recipes/mini.yaml "run.out_dir=$WORK/mini_$np"
       "train.max_steps=$MINI_STEPS" train.threads=1 log.every_steps=1 checkpoint.every_steps=0
       checkpoint.keep_last=1 eval.every_steps=0 eval.batches=1 sample.every_steps=0
       sample.max_new_tokens=1)
  if [ "$np" -eq 1 ]; then "${run[@]}"; else "${MPI[@]}" -np "$np" "${run[@]}"; fi > "$WORK/mini_$np.log" 2>&1 ||
    { tail -20 "$WORK/mini_$np.log" >&2; echo "measure.sh: mllm-train at np=$np failed" >&2; exit 1; }
  grep '"step_ms"' "$WORK/mini_$np/metrics.jsonl" > "$DATA/mini_np$np.jsonl"
  grep -m1 "parameters" "$WORK/mini_$np.log" >&2 || true
done

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "cores: $CORES"
  echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
  echo "openmpi: $(mpirun --version 2>&1 | head -1)"
  echo "load average: $LOAD_START before, $(cut -d' ' -f1 /proc/loadavg) after (1 minute)"
  if [ -s "$WORK/busy.txt" ]; then echo "not quiet: $(paste -sd';' "$WORK/busy.txt")"; else echo "quiet: CPUs >= 90% idle before every phase"; fi
  echo "np_list: $NP_LIST; reps: $REPS; target_ms: $TARGET_MS; overlap_iters: $OVERLAP_ITERS; mini_np: $MINI_NP; mini_steps: $MINI_STEPS"
} > "$DATA/machine.txt"
echo "measure.sh: wrote $DATA" >&2
