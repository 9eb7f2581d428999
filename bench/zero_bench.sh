#!/usr/bin/env bash
# ZeRO stage 1 (dist.zero_stage) on this machine, for the issue-16 figures (a benchmark, not a test):
#   1. per-rank memory at start-up (the trainer's "memory per rank" line) for the small shape
#      (d_model 512, 8 heads, 8 layers, d_ff 2048, seq 256, vocab 8192) at np 1, 2, 4, 8,
#      stage 0 and 1: AdamW state should be about 1/np at stage 1;
#   2. tokens/s of recipes/mini.yaml (the main job's shape) at stage 0 and 1, np 2 and 8,
#      interleaved A B A B, median of the steps after the first 5 of each run.
#   bench/zero_bench.sh [BUILD_DIR] [ROUNDS]      (defaults: build, 3)
# ZERO_BENCH_SKIP_MEMORY=1 skips part 1.
# Needs data/full/tang.jsonl (launch/fetch-corpus.sh). Runs as root need the OMPI_ALLOW_* variables.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build}" && pwd)"
ROUNDS="${2:-3}"
CORPUS="$ROOT/data/full/tang.jsonl"
[ -f "$CORPUS" ] || { echo "zero_bench.sh: $CORPUS missing (launch/fetch-corpus.sh)" >&2; exit 2; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mllm-zero.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
launch() { local np=$1; shift; if [ "$np" -eq 1 ]; then "$@"; else mpirun -np "$np" --bind-to none --oversubscribe "$@"; fi; }
COMMON=("data.corpus=[$CORPUS]" "data.cache_dir=$WORK/cache" eval.every_steps=0 "callbacks=[metrics]"
        checkpoint.resume=none checkpoint.every_steps=100000 log.every_steps=1 train.threads=1)

if [ "${ZERO_BENCH_SKIP_MEMORY:-0}" != 1 ]; then
  echo "1. memory per rank, small shape (AdamW moments: 2 x 4 bytes per element kept)"
  for np in 1 2 4 8; do
    for st in 0 1; do
      out="$WORK/mem$np$st"
      launch "$np" "$BUILD/bin/mllm-train" "$ROOT/recipes/mini.yaml" "${COMMON[@]}" "run.out_dir=$out" \
        data.tokenizer.max_vocab=8192 data.seq_len=256 model.d_model=512 model.n_heads=8 model.n_layers=8 \
        model.d_ff=2048 train.micro_batch=1 train.global_batch=$np train.max_steps=1 dist.zero_stage=$st \
        > "$WORK/mem.log" 2>&1 || { tail -5 "$WORK/mem.log" >&2; exit 1; }
      line=$(grep -m1 -o "memory per rank.*" "$out/logs/rank_00.log")
      echo "  np $np: $line"
    done
  done

fi
echo "2. tokens/s, recipes/mini.yaml, median of steps 6-30, $ROUNDS rounds interleaved"
tps() {  # np stage -> median tokens/s
  local out="$WORK/tps"; rm -rf "$out"
  launch "$1" "$BUILD/bin/mllm-train" "$ROOT/recipes/mini.yaml" "${COMMON[@]}" "run.out_dir=$out" \
    train.max_steps=30 dist.zero_stage="$2" > "$WORK/tps.log" 2>&1 || { tail -5 "$WORK/tps.log" >&2; exit 1; }
  python3 - "$out/metrics.jsonl" <<'PY'
import json, statistics, sys
v = [json.loads(l)["tokens_per_s"] for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
print(f"{statistics.median(v[5:]):.0f}")
PY
}
for np in 2 8; do
  a=() b=()
  tps "$np" 0 > /dev/null  # prepares the data outside the timing
  for _ in $(seq 1 "$ROUNDS"); do a+=("$(tps "$np" 0)"); b+=("$(tps "$np" 1)"); done
  python3 - "$np" "${a[*]}" "${b[*]}" <<'PY'
import statistics, sys
a = [float(x) for x in sys.argv[2].split()]; b = [float(x) for x in sys.argv[3].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"  np {sys.argv[1]}: stage 0 {ma:.0f} tok/s {a}, stage 1 {mb:.0f} tok/s {b}: stage 1 / stage 0 = {mb / ma:.3f}")
PY
done
