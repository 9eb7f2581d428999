# Shared helpers for the end-to-end scripts (sourced). ctest sets MLLM_BIN and MLLM_SOURCE_DIR
# and the OpenMPI variables (run as root, oversubscription).
set -euo pipefail
: "${MLLM_BIN:?set by ctest}" "${MLLM_SOURCE_DIR:?set by ctest}"
# What the programs read from the environment, pinned whatever the caller's: the scripts grep
# mllm-train's info lines (its output and logs/rank_*.log), so MLLM_LOG_LEVEL=warn or error would
# fail them; MLLM_FAULT is set by a test on the commands it means to fail; recipes are given as
# paths (no MLLM_SHARE_DIR lookup). Exported: mpirun, sweep.sh and Slurm jobs pass it on.
export MLLM_LOG_LEVEL=info
unset MLLM_FAULT MLLM_SHARE_DIR
WORK=$(mktemp -d /tmp/mllm_e2e.XXXXXX)
cleanup() { [ -n "${KEEP_WORK:-}" ] && return 0; local jobs_left; jobs_left=$(jobs -p); [ -z "$jobs_left" ] || kill $jobs_left 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT  # never leave a trainer running
CACHE="$WORK/cache"
RECIPE="$MLLM_SOURCE_DIR/tests/assets/tiny.yaml"
CORPUS="$MLLM_SOURCE_DIR/data/tang300/tang300.jsonl"

fail() { echo "FAIL: $*" >&2; exit 1; }

# train NP OUT_DIR [overrides...]: runs mllm-train with NP ranks (1 = no mpirun).
train() {
  local np=$1 out=$2; shift 2
  local cmd=("$MLLM_BIN/mllm-train" "$RECIPE" "run.out_dir=$out" "data.cache_dir=$CACHE"
             "data.corpus=[$CORPUS]" "$@")
  if [ "$np" -eq 1 ]; then "${cmd[@]}"; else mpirun -np "$np" --bind-to none "${cmd[@]}"; fi
}

# field FILE KEY: the KEY values of metrics.jsonl lines that have a "loss", one per line "step value".
field() {
  python3 - "$1" "$2" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    o = json.loads(line)
    if "loss" in o:
        print(o["step"], repr(o[sys.argv[2]]))
PY
}

# close A B: the losses and gradient norms of two runs (folders) agree within 1e-6 relative at
# steps 1-20 (zero1.sh, zero2.sh).
close() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY' || fail "$1 and $2 differ"
import json, sys
def rows(p):
    return {o["step"]: o for o in map(json.loads, open(p)) if "loss" in o}
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert sorted(a) == sorted(b) == list(range(1, 21)), f"steps {sorted(a)} vs {sorted(b)}"
for s in a:
    for k in ("loss", "grad_norm"):
        rel = abs(a[s][k] - b[s][k]) / abs(a[s][k])
        assert rel < 1e-6, f"step {s} {k}: {a[s][k]} vs {b[s][k]} (rel {rel:.2e})"
PY
}

# The ZeRO scripts' helpers (zero2.sh, zero3.sh).
CHECK=(dist.check_every_steps=1)
LLAMA=(model.type=llama model.n_heads=4 model.n_kv_heads=2 model.tie_embeddings=true model.multiple_of=16)
# same A B: the losses and gradient norms of two runs are bitwise equal.
same() {
  diff <(field "$1/metrics.jsonl" loss) <(field "$2/metrics.jsonl" loss) > /dev/null ||
    fail "$1 and $2: losses not bitwise equal"
  diff <(field "$1/metrics.jsonl" grad_norm) <(field "$2/metrics.jsonl" grad_norm) > /dev/null ||
    fail "$1 and $2: gradient norms not bitwise equal"
}
# run NP OUT overrides...: train, and show the log's tail on failure
run() {
  local np=$1 out=$2; shift 2
  train "$np" "$out" "$@" > "$out.log" 2>&1 || { tail -n 20 "$out.log" >&2; fail "$out"; }
}
# chain OUT STAGE_A STAGE_B STAGE_C: np 4 to step 7, np 2 to step 14, np 3 to step 20, at the
# three stages, replicas checked every step at the end (dropout 0: dropout streams are per
# rank; 24 sequences per step divide among 4, 2 and 3 ranks).
D=(model.dropout=0.0 train.global_batch=24)
chain() {
  run 4 "$1" "${D[@]}" dist.zero_stage="$2" train.stop_at_step=7
  run 2 "$1" "${D[@]}" dist.zero_stage="$3" train.stop_at_step=14
  run 3 "$1" "${D[@]}" dist.zero_stage="$4" "${CHECK[@]}"
}
# against_stage0 NP STAGE: minillm and a tied grouped-query llama, 20 steps at stage 0 and at
# STAGE (replicas checked every step) into $WORK/s0_FAMILY_npNP and $WORK/sSTAGE_FAMILY_npNP;
# their losses and gradient norms agree within 1e-6 relative (close).
against_stage0() {
  local np=$1 stage=$2 family extra
  for family in minillm llama; do
    extra=(); [ "$family" = llama ] && extra=("${LLAMA[@]}")
    run "$np" "$WORK/s0_${family}_np$np" "${extra[@]}" "${CHECK[@]}"
    run "$np" "$WORK/s${stage}_${family}_np$np" "${extra[@]}" "${CHECK[@]}" dist.zero_stage="$stage"
    close "$WORK/s0_${family}_np$np" "$WORK/s${stage}_${family}_np$np"
  done
}
# resume_bitwise STAGE: 2 ranks at STAGE, stopped at step 10 and resumed, give bitwise the
# losses, gradient norms and final weights of the straight run $WORK/sSTAGE_minillm_np2.
resume_bitwise() {
  local stage=$1
  run 2 "$WORK/split" dist.zero_stage="$stage" train.stop_at_step=10
  run 2 "$WORK/split" dist.zero_stage="$stage"
  grep -q "resumed from" "$WORK/split.log" || fail "stage $stage did not resume"
  same "$WORK/s${stage}_minillm_np2" "$WORK/split"
  cmp "$WORK/s${stage}_minillm_np2/checkpoints/step_000020/model.safetensors" \
      "$WORK/split/checkpoints/step_000020/model.safetensors" || fail "stage $stage resume: weights differ"
}
