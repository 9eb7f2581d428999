#!/usr/bin/env bash
# launch/slurm.sbatch: bash -n; the dry run prints the expected commands for a CPU (srun) and a
# GPU (mpirun) SLURM_* environment and refuses bad input with exit 2; then a job with stub srun
# (mpirun -np SLURM_NTASKS on this machine) and stub sbatch: a time-limited stop resubmits with
# the same geometry, a job without progress does not, and a finished run exits 0 untouched.
source "$(dirname "$0")/../e2e/common.sh"
SB="$MLLM_SOURCE_DIR/launch/slurm.sbatch"
bash -n "$SB" || fail "bash -n"
unset MLLM_DRY_RUN MLLM_MODE MLLM_RUN_DIR MLLM_SUBMISSION
REL=tests/assets/tiny.yaml            # relative to MLLM_ROOT, as a job sees it
NOW=$(date +%s)
CPU_ENV=(MLLM_DRY_RUN=1 MLLM_ROOT="$MLLM_SOURCE_DIR" SLURM_JOB_ID=42 SLURM_NTASKS=8 SLURM_JOB_NUM_NODES=4
         SLURM_NTASKS_PER_NODE=2 SLURM_CPUS_PER_TASK=16 SLURM_JOB_END_TIME=$((NOW + 3600))
         SLURM_JOB_NAME=poems SLURM_JOB_PARTITION=cpu SLURM_JOB_ACCOUNT=lab)
DATA=("data.cache_dir=$CACHE" "data.corpus=[$CORPUS]")

# The + lines, with the time limit (3300 s minus the seconds this test has taken) as LIMIT.
plus() { sed -n 's/^+ //p' | sed -E 's/train\.time_limit_s=(3[0-9]{3})\b/train.time_limit_s=LIMIT/'; }
q() { local s; printf -v s '%q ' "$@"; echo "${s% }"; }

env "${CPU_ENV[@]}" bash "$SB" "$REL" "${DATA[@]}" > "$WORK/cpu" 2> "$WORK/cpu.err" || { cat "$WORK/cpu.err" >&2; fail "cpu dry run"; }
limit=$(grep -oE 'train\.time_limit_s=[0-9]+' "$WORK/cpu" | cut -d= -f2)
[ "$limit" -le 3300 ] && [ "$limit" -ge 3240 ] || fail "time limit $limit, want 3300 minus the test's seconds"
B=(dist.backend=mpi train.threads=16)
diff <(plus < "$WORK/cpu") - <<EOT || fail "cpu dry run commands"
$(q "$MLLM_BIN/mllm-prepare" "$REL" "${B[@]}" "${DATA[@]}")
$(q srun --mpi=pmix --kill-on-bad-exit=1 --nodes=4 --ntasks=8 --ntasks-per-node=2 --cpus-per-task=16 --cpu-bind=sockets "$MLLM_BIN/mllm-train" "$REL" "${B[@]}" train.time_limit_s=LIMIT "${DATA[@]}")
$(q sbatch --dependency=afterany:42 --export=ALL,MLLM_SUBMISSION=2 --job-name=poems --nodes=4 --ntasks-per-node=2 --cpus-per-task=16 --partition=cpu --account=lab "$MLLM_SOURCE_DIR/launch/slurm.sbatch" "$REL" "${DATA[@]}")
EOT

GPU_ENV=(MLLM_DRY_RUN=1 MLLM_ROOT="$MLLM_SOURCE_DIR" MLLM_MODE=gpu MLLM_LAUNCHER=mpirun MLLM_RESUBMIT=requeue
         MLLM_RUN_DIR="$WORK/gpu-run" SLURM_JOB_ID=7 SLURM_NTASKS=8 SLURM_NNODES=2 "SLURM_TASKS_PER_NODE=4(x2)"
         SLURM_CPUS_PER_TASK=8 SLURM_GPUS_PER_NODE=4)
env "${GPU_ENV[@]}" bash "$SB" "$REL" "${DATA[@]}" train.max_steps=9 > "$WORK/gpu" 2> "$WORK/gpu.err" || { cat "$WORK/gpu.err" >&2; fail "gpu dry run"; }
grep -q "time left unknown" "$WORK/gpu.err" || fail "no warning about the unknown time limit"
B=(dist.backend=nccl train.threads=8 "run.out_dir=$WORK/gpu-run")
diff <(plus < "$WORK/gpu") - <<EOT || fail "gpu dry run commands"
$(q "$MLLM_BIN/mllm-prepare" "$REL" "${B[@]}" "${DATA[@]}" train.max_steps=9)
$(q mpirun -np 8 --map-by ppr:4:node:PE=8 --bind-to core -x OMP_NUM_THREADS -x PATH -x LD_LIBRARY_PATH "$MLLM_BIN/mllm-train" "$REL" "${B[@]}" "${DATA[@]}" train.max_steps=9)
$(q scontrol requeue 7)
EOT
grep -q "step_000009" "$WORK/gpu.err" || fail "gpu dry run does not name the final checkpoint step_000009"

# expect2 ENV... -- ARGS...: exit 2 with a message and no srun/mpirun line.
expect2() {
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  set +e; env "${CPU_ENV[@]}" "${envs[@]}" bash "$SB" "$@" > "$WORK/out" 2> "$WORK/err"; local code=$?; set -e
  [ "$code" -eq 2 ] || { cat "$WORK/err" >&2; fail "slurm.sbatch $* (${envs[*]}) exited $code, want 2"; }
  [ -s "$WORK/err" ] || fail "slurm.sbatch $*: no message"
  ! grep -q "^+ \(srun\|mpirun\|sbatch\)" "$WORK/out" || fail "slurm.sbatch $*: launched despite bad input"
}
expect2 -- "$REL" "${DATA[@]}" model.n_head=2                      # recipe refuses the key
expect2 -- missing.yaml                                            # no recipe
expect2 SLURM_JOB_ID= -- "$REL" "${DATA[@]}"                       # not in a job
expect2 SLURM_NTASKS= -- "$REL" "${DATA[@]}"
expect2 MLLM_MODE=tpu -- "$REL" "${DATA[@]}"
expect2 MLLM_LAUNCHER=ssh -- "$REL" "${DATA[@]}"
expect2 SLURM_JOB_END_TIME=$((NOW + 200)) -- "$REL" "${DATA[@]}"   # under the margin
expect2 MLLM_MIN_TRAIN_S=1m -- "$REL" "${DATA[@]}"
expect2 MLLM_MIN_TRAIN_S=0 -- "$REL" "${DATA[@]}"
expect2 MLLM_TIME_MARGIN_S=5m -- "$REL" "${DATA[@]}"
expect2 MLLM_TIME_MARGIN_S=-30 -- "$REL" "${DATA[@]}"
expect2 MLLM_TIME_MARGIN_S=100 MLLM_MIN_TRAIN_S=3550 -- "$REL" "${DATA[@]}"   # under the minimum

# A job on this machine: srun = mpirun -np SLURM_NTASKS, sbatch records its arguments.
mkdir -p "$WORK/stubs"
cat > "$WORK/stubs/srun" <<'STUB'
#!/usr/bin/env bash
while [[ "$1" == --* ]]; do shift; done
exec mpirun -np "$SLURM_NTASKS" --bind-to none "$@"
STUB
cat > "$WORK/stubs/sbatch" <<'STUB'
#!/usr/bin/env bash
printf '%s\n' "$@" > "$SBATCH_LOG"
STUB
chmod +x "$WORK/stubs/srun" "$WORK/stubs/sbatch"
RUN="$WORK/run"
JOB_ENV=(PATH="$WORK/stubs:$PATH" SBATCH_LOG="$WORK/sbatch.args" MLLM_ROOT="$MLLM_SOURCE_DIR" MLLM_RUN_DIR="$RUN"
         SLURM_JOB_ID=100 SLURM_NTASKS=2 SLURM_JOB_NUM_NODES=1 SLURM_NTASKS_PER_NODE=2 SLURM_CPUS_PER_TASK=1
         SLURM_JOB_END_TIME=$((NOW + 3600)))
T=(train.max_steps=6 checkpoint.every_steps=0 eval.every_steps=0)
env "${JOB_ENV[@]}" bash "$SB" "$REL" "${DATA[@]}" "${T[@]}" train.stop_at_step=3 > "$WORK/job1" 2>&1 \
  || { cat "$WORK/job1" >&2; fail "job 1"; }
[ "$(cat "$RUN/checkpoints/latest")" = step_000003 ] || fail "job 1 did not stop at step 3"
grep -q "world size 2" "$RUN/logs/rank_00.log" || fail "job 1 did not run 2 ranks"
diff "$WORK/sbatch.args" <(printf '%s\n' --dependency=afterany:100 --export=ALL,MLLM_SUBMISSION=2 --job-name=mllm \
  --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 "$MLLM_SOURCE_DIR/launch/slurm.sbatch" "$REL" "${DATA[@]}" \
  "${T[@]}" train.stop_at_step=3) || fail "job 1 resubmission"
rm "$WORK/sbatch.args"
# The resubmission with the same stop makes no progress: no further job, exit 1.
set +e; env "${JOB_ENV[@]}" MLLM_SUBMISSION=2 bash "$SB" "$REL" "${DATA[@]}" "${T[@]}" train.stop_at_step=3 > "$WORK/job2" 2>&1; code=$?; set -e
[ "$code" -eq 1 ] || { cat "$WORK/job2" >&2; fail "job 2 exited $code, want 1"; }
grep -q "no new checkpoint" "$WORK/job2" || fail "job 2: no message"
[ ! -e "$WORK/sbatch.args" ] || fail "job 2 resubmitted"
# Without the stop: resumes, finishes, no resubmission; then a further job does nothing.
env "${JOB_ENV[@]}" MLLM_SUBMISSION=3 bash "$SB" "$REL" "${DATA[@]}" "${T[@]}" > "$WORK/job3" 2>&1 || { cat "$WORK/job3" >&2; fail "job 3"; }
grep -q "resumed from .*step_000003 at step 3" "$RUN/logs/rank_00.log" || fail "job 3 did not resume"
[ "$(cat "$RUN/checkpoints/latest")" = step_000006 ] || fail "job 3 did not finish"
[ ! -e "$WORK/sbatch.args" ] || fail "job 3 resubmitted a finished run"
env "${JOB_ENV[@]}" bash "$SB" "$REL" "${DATA[@]}" "${T[@]}" > "$WORK/job4" 2>&1 || fail "job 4"
grep -q "is finished" "$WORK/job4" && ! grep -q "^+ srun" "$WORK/job4" || fail "job 4 trained a finished run"
echo PASS
