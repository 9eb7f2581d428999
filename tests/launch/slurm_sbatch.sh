#!/usr/bin/env bash
# launch/slurm.sbatch: bash -n; the dry run prints the expected commands for a CPU (srun) and a
# GPU (mpirun) SLURM_* environment and refuses bad input with exit 2; the time left is the earlier
# of SLURM_JOB_END_TIME and squeue's answer (stub squeue), with a warning only when squeue gives
# none; then a job with stub srun (mpirun -np SLURM_NTASKS on this machine) and stub sbatch: a
# time-limited stop resubmits with the same geometry, a job without progress does not, and a
# finished run exits 0 untouched.
source "$(dirname "$0")/../e2e/common.sh"
SB="$MLLM_SOURCE_DIR/launch/slurm.sbatch"
bash -n "$SB" || fail "bash -n"
# The script's settings and Slurm's variables come from the commands below only, not from the
# caller's environment (say, a shell inside a Slurm job).
unset MLLM_DRY_RUN MLLM_MODE MLLM_RUN_DIR MLLM_SUBMISSION MLLM_LAUNCHER MLLM_SRUN_MPI MLLM_TIME_MARGIN_S \
  MLLM_MIN_TRAIN_S MLLM_RESUBMIT MLLM_MAX_SUBMISSIONS MLLM_SBATCH_ARGS MLLM_ROOT
for v in $(compgen -e); do case "$v" in SLURM_*|SBATCH_*|SQUEUE_*) unset "$v" ;; esac; done
unset STUB_SQUEUE_LEFT STUB_SQUEUE_LIMIT
REL=tests/assets/tiny.yaml            # relative to MLLM_ROOT, as a job sees it
NOW=$(date +%s)
# Stub squeue, first on every PATH below (a real one would ask this machine's Slurm, if any):
# -o %L prints STUB_SQUEUE_LEFT, -o %l STUB_SQUEUE_LIMIT; unset, it fails as a squeue that
# cannot reach slurmctld does (an error on stderr, nothing on stdout), like no squeue at all.
mkdir -p "$WORK/sq"
cat > "$WORK/sq/squeue" <<'STUB'
#!/usr/bin/env bash
v=
for a; do case "$a" in %L) v=${STUB_SQUEUE_LEFT:-} ;; %l) v=${STUB_SQUEUE_LIMIT:-} ;; esac; done
[ -n "$v" ] || { echo "squeue: error: Unable to contact slurm controller (connect failure)" >&2; exit 1; }
echo "$v"
STUB
chmod +x "$WORK/sq/squeue"
CPU_ENV=(PATH="$WORK/sq:$PATH" MLLM_DRY_RUN=1 MLLM_ROOT="$MLLM_SOURCE_DIR" SLURM_JOB_ID=42 SLURM_NTASKS=8 SLURM_JOB_NUM_NODES=4
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
# squeue gave no answer: SLURM_JOB_END_TIME alone (above), with a warning that says so.
grep -q "warning: no answer from squeue" "$WORK/cpu.err" || fail "no warning that squeue did not answer: $(cat "$WORK/cpu.err")"

# time_args ENV...: the dry run's train.time_limit_s (stderr in $WORK/t.err; empty: none).
time_args() {
  env "${CPU_ENV[@]}" "$@" bash "$SB" "$REL" "${DATA[@]}" > "$WORK/t.out" 2> "$WORK/t.err" || { cat "$WORK/t.err" >&2; fail "dry run with $*"; }
  sed -n 's/^+ srun .*train\.time_limit_s=\([0-9]*\).*/\1/p' "$WORK/t.out"
}
no_warning() { ! grep -q "no answer from squeue\|time left unknown" "$WORK/t.err" || fail "$1: $(cat "$WORK/t.err")"; }
# A time limit lowered with scontrol update after the start: SLURM_JOB_END_TIME still says an
# hour, squeue 30 minutes: squeue's, the earlier, counts (1800 - 300). It answered: no warning.
[ "$(time_args STUB_SQUEUE_LEFT=30:00 STUB_SQUEUE_LIMIT=1:00:00)" = 1500 ] || fail "squeue's earlier end not used: $(cat "$WORK/t.out" "$WORK/t.err")"
no_warning "squeue answered 30:00"
grep -q "^+ sbatch .*--time=1:00:00 " "$WORK/t.out" || fail "resubmission without squeue's time limit: $(grep '^+ sbatch' "$WORK/t.out")"
# squeue later than SLURM_JOB_END_TIME: the environment's end, the earlier, counts.
limit=$(time_args STUB_SQUEUE_LEFT=2:00:00)
[ "$limit" -le 3300 ] && [ "$limit" -ge 3240 ] || fail "squeue 2 h, SLURM_JOB_END_TIME 1 h: limit $limit"
no_warning "squeue answered 2:00:00"
# squeue alone (D-HH:MM:SS), and squeue's answer of no limit: no "no answer" warning.
[ "$(time_args SLURM_JOB_END_TIME= STUB_SQUEUE_LEFT=1-00:00:00)" = 86100 ] || fail "squeue 1-00:00:00 alone"
no_warning "squeue alone"
limit=$(time_args STUB_SQUEUE_LEFT=UNLIMITED)
[ "$limit" -le 3300 ] && [ "$limit" -ge 3240 ] || fail "squeue UNLIMITED, SLURM_JOB_END_TIME 1 h: limit $limit"
no_warning "squeue answered UNLIMITED"
[ -z "$(time_args SLURM_JOB_END_TIME= STUB_SQUEUE_LEFT=UNLIMITED)" ] || fail "squeue UNLIMITED alone gave a limit"
grep -q "time left unknown (no SLURM_JOB_END_TIME; squeue says 'UNLIMITED')" "$WORK/t.err" &&
  ! grep -q "no answer from squeue" "$WORK/t.err" || fail "squeue UNLIMITED alone: $(cat "$WORK/t.err")"

GPU_ENV=(PATH="$WORK/sq:$PATH" MLLM_DRY_RUN=1 MLLM_ROOT="$MLLM_SOURCE_DIR" MLLM_MODE=gpu MLLM_LAUNCHER=mpirun MLLM_RESUBMIT=requeue
         MLLM_RUN_DIR="$WORK/gpu-run" SLURM_JOB_ID=7 SLURM_NTASKS=8 SLURM_NNODES=2 "SLURM_TASKS_PER_NODE=4(x2)"
         SLURM_CPUS_PER_TASK=8 SLURM_GPUS_PER_NODE=4)
env "${GPU_ENV[@]}" bash "$SB" "$REL" "${DATA[@]}" train.max_steps=9 > "$WORK/gpu" 2> "$WORK/gpu.err" || { cat "$WORK/gpu.err" >&2; fail "gpu dry run"; }
grep -q "time left unknown (no SLURM_JOB_END_TIME, no answer from squeue)" "$WORK/gpu.err" || fail "no warning about the unknown time limit"
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
expect2 STUB_SQUEUE_LEFT=3:20 -- "$REL" "${DATA[@]}"               # lowered under the margin
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
JOB_ENV=(PATH="$WORK/stubs:$WORK/sq:$PATH" SBATCH_LOG="$WORK/sbatch.args" MLLM_ROOT="$MLLM_SOURCE_DIR" MLLM_RUN_DIR="$RUN"
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
