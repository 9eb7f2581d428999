#!/usr/bin/env bash
# launch/slurm.sbatch under a real Slurm (munged + slurmctld + slurmd on 127.0.0.1, started for
# this test in a temporary folder, tests/launch/slurm_cluster.sh). A 2-task job with a 1-minute
# time limit stops itself before the limit (train.time_limit_s), checkpoints and resubmits; the
# chain must take at least 3 jobs. One running job is cancelled with scancel (SIGTERM to its
# ranks): it must leave a checkpoint that a new submission resumes from. At the end: latest is
# step_<max_steps>, metrics.jsonl holds every step once, and every loss is bitwise the loss of a
# straight `mpirun -np 2` run of the same recipe. The cluster is torn down on every exit, and the
# test fails if any of its processes survive. Skipped (77) without root or Slurm packages.
source "$(dirname "$0")/../e2e/common.sh"
source "$(dirname "$0")/slurm_cluster.sh"
# The environment, pinned whatever the caller's: common.sh exports MLLM_LOG_LEVEL=info (the
# checks below read mllm-train's info lines: "step N/M", "stopping at step", "received a stop
# signal", "resumed from"; sbatch passes the environment on to the jobs), and no variable of an
# enclosing Slurm job or a user's Slurm defaults (SLURM_*, SBATCH_*, SQUEUE_*, ...) reaches the
# test cluster's commands or jobs.
for v in $(compgen -e); do
  case "$v" in SLURM_*|SBATCH_*|SALLOC_*|SRUN_*|SQUEUE_*|SCANCEL_*|SINFO_*|SCONTROL_*) unset "$v" ;; esac
done
SLURM_UP=0
teardown() {
  local code=$?
  if [ "$SLURM_UP" = 1 ]; then
    # On failure, the cluster's logs say why a job did not run.
    [ "$code" -eq 0 ] || tail -n 15 "$WORK"/slurm/log/slurmctld.log "$WORK"/slurm/log/slurmd.log "$WORK"/slurm-*.out >&2 2>/dev/null || true
    slurm_cluster_stop || { echo "FAIL: processes of the test cluster survived teardown" >&2; code=1; }
  fi
  cleanup
  exit "$code"
}
trap teardown EXIT

# Up before the start: a start that fails half-way leaves daemons the teardown must stop.
SLURM_UP=1
set +e; slurm_cluster_start "$WORK/slurm" 2; code=$?; set -e
[ "$code" -ne 77 ] || exit 77
[ "$code" -eq 0 ] || fail "the test cluster did not start"
echo "slurm_live: cluster up (SLURM_CONF=$SLURM_CONF)"

REL=tests/assets/tiny.yaml
RUN="$WORK/run"
BASE=("data.cache_dir=$CACHE" "data.corpus=[$CORPUS]")

# Every mpirun is bounded (timeout), so a hang ends here, with the teardown, not by ctest's
# SIGKILL at TIMEOUT (which skips the EXIT trap and would leave the daemons running).
train() {
  local np=$1 out=$2; shift 2
  timeout 400 mpirun -np "$np" --bind-to none "$MLLM_BIN/mllm-train" "$MLLM_SOURCE_DIR/$REL" \
    "run.out_dir=$out" "${BASE[@]}" "$@"
}
# Calibrate: the median step time of this machine at np=2, so that the run needs about 4 jobs of
# ~14 s of training (the jobs' train.time_limit_s) whatever the machine's speed.
train 2 "$WORK/calib" train.max_steps=600 checkpoint.every_steps=0 eval.every_steps=0 > "$WORK/calib.log" 2>&1 \
  || { cat "$WORK/calib.log" >&2; fail "calibration run"; }
STEP_MS=$(python3 -c '
import json, statistics, sys
ms = [json.loads(l)["step_ms"] for l in open(sys.argv[1]) if "step_ms" in l]
print(statistics.median(ms))' "$WORK/calib/metrics.jsonl")
STEPS=$(python3 -c 'import sys; print(max(200, int(56000 / (float(sys.argv[1]) * 1.1))))' "$STEP_MS")
T=(train.max_steps="$STEPS" checkpoint.every_steps=$(( STEPS / 3 )) eval.every_steps=$(( STEPS / 4 )))
echo "slurm_live: median step ${STEP_MS} ms; the run is $STEPS steps"

# The reference: one straight mpirun, no stop.
train 2 "$WORK/ref" "${T[@]}" > "$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log" >&2; fail "reference run"; }

# The chain. 1-minute jobs; 45 s kept free leaves train.time_limit_s ~ 14 s per job.
export MLLM_BIN MLLM_ROOT="$MLLM_SOURCE_DIR" MLLM_TIME_MARGIN_S=45 MLLM_MIN_TRAIN_S=5 MLLM_RUN_DIR="$RUN"
# --signal: the script's own TERM@120 would fire at once in a 1-minute job (docs/multinode.md).
export MLLM_SBATCH_ARGS="--output=$WORK/slurm-%j.out --signal=TERM@5"
unset MLLM_SUBMISSION MLLM_RESUBMIT MLLM_LAUNCHER MLLM_MODE MLLM_DRY_RUN MLLM_SRUN_MPI MLLM_MAX_SUBMISSIONS
SUBMIT=(sbatch --parsable --output="$WORK/slurm-%j.out" --signal=TERM@5 --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --time=1
        "$MLLM_SOURCE_DIR/launch/slurm.sbatch" "$REL" "${BASE[@]}" "${T[@]}")
cd "$MLLM_SOURCE_DIR"
FIRST=$("${SUBMIT[@]}") || fail "sbatch refused the job"
echo "slurm_live: submitted job $FIRST"

# jobs_now: ids of jobs pending or running; "?" when squeue cannot reach slurmctld (so the
# wait loops keep waiting instead of taking an error for an empty queue).
jobs_now() { local q; q=$(squeue -h -o %i 2>/dev/null) || { echo "?"; return 0; }; sort -n <<< "$q" | sed '/^$/d'; }
latest() { cat "$RUN/checkpoints/latest" 2>/dev/null || echo none; }
steps_logged() { [ -f "$RUN/metrics.jsonl" ] && grep -c '"loss"' "$RUN/metrics.jsonl" || echo 0; }

# Wait for the third job of the chain to run and train at least 20 steps past its resume point,
# then cancel it.
THIRD=$(( FIRST + 2 ))
deadline=$(( SECONDS + 240 ))
cancelled=0
while [ $SECONDS -lt $deadline ]; do
  state=$(squeue -h -j "$THIRD" -o %T 2>/dev/null || true)
  if [ "$state" = RUNNING ] && [ -f "$WORK/slurm-$THIRD.out" ]; then
    from=$(sed -n 's/.*(latest: step_0*\([0-9]*\)).*/\1/p' "$WORK/slurm-$THIRD.out" | head -n 1)
    if [ -n "$from" ] && [ "$(grep -c "step  *[0-9]*/$STEPS" "$WORK/slurm-$THIRD.out")" -ge 20 ]; then
      scancel "$THIRD"; cancelled=1; break
    fi
  fi
  [ -n "$(jobs_now)" ] || break   # the chain ended (finished or failed) before job 3 ran long enough
  sleep 0.5
done
[ "$cancelled" = 1 ] || fail "job $THIRD (the chain's third) never ran 20 steps; jobs: $(ls "$WORK"/slurm-*.out 2>/dev/null | tr '\n' ' ')"
echo "slurm_live: cancelled job $THIRD (resumed at step $from)"
# The cancelled job's ranks save on SIGTERM; Slurm holds the node until they exit.
deadline=$(( SECONDS + 90 ))
while [ -n "$(jobs_now)" ] && [ $SECONDS -lt $deadline ]; do sleep 0.5; done
[ -z "$(jobs_now)" ] || fail "jobs still queued 90 s after scancel: $(jobs_now | tr '\n' ' ')"
grep -q "received a stop signal" "$RUN/logs/rank_00.log" || fail "the cancelled job's ranks did not see SIGTERM"
after_cancel=$(latest)
[ "$after_cancel" != none ] && [ "$((10#${after_cancel#step_}))" -gt "$from" ] ||
  fail "scancel left latest = $after_cancel, not a checkpoint past step $from"
[ "$after_cancel" != "$(printf 'step_%06d' "$STEPS")" ] || fail "the run had finished before scancel"
for j in $(seq "$FIRST" $(( THIRD - 1 ))); do
  grep -q "stopping at step [0-9]*: reached train.time_limit_s" "$WORK/slurm-$j.out" ||
    fail "job $j did not stop at its train.time_limit_s: $(grep -o 'stopping at step.*' "$WORK/slurm-$j.out")"
  grep -q "^+ sbatch --dependency=afterany:$j .*--signal=TERM@5" "$WORK/slurm-$j.out" || fail "job $j did not resubmit the chain"
done

# Submit again, as a user would after a cancel: the new chain resumes and finishes.
AGAIN=$("${SUBMIT[@]}") || fail "sbatch refused the resubmission"
deadline=$(( SECONDS + 300 ))
while [ -n "$(jobs_now)" ] && [ $SECONDS -lt $deadline ]; do sleep 1; done
[ -z "$(jobs_now)" ] || fail "the chain after the cancel did not end within 300 s"
grep -q "resumed from .*$after_cancel at step" "$WORK/slurm-$AGAIN.out" ||
  fail "job $AGAIN did not resume from $after_cancel"
[ "$(latest)" = "$(printf 'step_%06d' "$STEPS")" ] || fail "latest is $(latest), want step $STEPS"
grep -q "finished: .*step_0*$STEPS" "$WORK"/slurm-*.out || fail "no job said the run is finished"
njobs=$(ls "$WORK"/slurm-*.out | wc -l)
echo "slurm_live: $njobs jobs in all"

# Every step once, and the losses of the straight run, bitwise.
field "$RUN/metrics.jsonl" loss > "$WORK/chain.loss"
field "$WORK/ref/metrics.jsonl" loss > "$WORK/ref.loss"
[ "$(cut -d' ' -f1 "$WORK/chain.loss" | sort -n | uniq -d | wc -l)" -eq 0 ] || fail "metrics.jsonl repeats steps"
diff <(cut -d' ' -f1 "$WORK/chain.loss") <(seq 1 "$STEPS") > /dev/null || fail "metrics.jsonl does not hold steps 1..$STEPS in order"
diff "$WORK/chain.loss" "$WORK/ref.loss" > "$WORK/loss.diff" ||
  { head -n 5 "$WORK/loss.diff" >&2; fail "the chain's losses differ from the straight run's"; }

# Teardown leaves nothing running (checked again by the trap on any exit).
slurm_cluster_stop || fail "processes of the test cluster survived teardown"
SLURM_UP=0
echo PASS
