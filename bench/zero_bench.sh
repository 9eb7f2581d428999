#!/usr/bin/env bash
# ZeRO stages 1, 2 and 3 (dist.zero_stage) and activation checkpointing on this machine (a
# benchmark, not a test; figures in bench/README.md):
#   1. per-rank memory at start-up (the trainer's "memory per rank" line) for the small shape
#      (d_model 512, 8 heads, 8 layers, d_ff 2048, seq 256, vocab 8192) at np 1, 2, 4, 8,
#      stages 0-3: AdamW state about 1/np at stages 1-3, gradients 1/np at stages 2-3,
#      parameters 1/np at stage 3 (plus what a step gathers), and the measured peak RSS of
#      rank 0 over one step (metrics.jsonl peak_rss_bytes);
#   2. tokens/s at stages 0-3, np 2, 1 thread per rank: recipes/mini.yaml (the main job's
#      shape, median of steps 6-30) and the small shape (steps 3-12, accumulation 2),
#      interleaved stage by stage, round by round;
#   3. activation checkpointing, small shape at seq_len 1024 (micro-batch 2, one rank, 2
#      threads): peak RSS (metrics.jsonl peak_rss_bytes, the highest interval) and tokens/s,
#      none vs full, interleaved.
#   4. a model too large for stage 0 here: a ~530M-parameter llama (d_model 2048, 16 heads,
#      10 layers, d_ff 5632, tied embeddings) at np 4 needs 4 x 16 bytes x 530M = 34 GB at
#      stage 0 (more than this 24 GiB machine); it trains at stage 3 with every block
#      checkpointed (seq 128, one sequence per rank, 3 steps): each rank's peak RSS (GNU time's
#      maximum resident set size, start-up included), the start-up memory line, seconds per step.
#   bench/zero_bench.sh [BUILD_DIR] [ROUNDS]      (defaults: build, 3)
# ZERO_BENCH_PARTS="1 2 3" chooses the parts, ZERO_BENCH_SHAPES="mini small" part 2's shapes (4 only when named: it takes minutes and most of
# the machine's memory).
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

PARTS="${ZERO_BENCH_PARTS:-1 2 3}"
median() {  # metrics.jsonl FIRST_INDEX KEY -> median (KEY: tokens_per_s) or max of KEY
  python3 - "$@" <<'PY'
import json, statistics, sys
path, first, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
v = [json.loads(l)[key] for l in open(path) if f'"{key}"' in l]
print(f"{statistics.median(v[first:]) if key == 'tokens_per_s' else max(v):.0f}")
PY
}
SMALL=(data.tokenizer.max_vocab=8192 model.d_model=512 model.n_heads=8 model.n_layers=8 model.d_ff=2048)
if [[ " $PARTS " == *" 1 "* ]]; then
  echo "1. memory per rank, small shape (AdamW moments: 2 x 4 bytes per element kept)"
  for np in 1 2 4 8; do
    for st in 0 1 2 3; do
      out="$WORK/mem$np$st"
      launch "$np" "$BUILD/bin/mllm-train" "$ROOT/recipes/mini.yaml" "${COMMON[@]}" "run.out_dir=$out" \
        "${SMALL[@]}" data.seq_len=256 train.micro_batch=1 train.global_batch=$np train.max_steps=1 dist.zero_stage=$st \
        > "$WORK/mem.log" 2>&1 || { tail -5 "$WORK/mem.log" >&2; exit 1; }
      line=$(grep -m1 -o "memory per rank.*" "$out/logs/rank_00.log")
      echo "  np $np: $line; measured peak RSS $(( $(median "$out/metrics.jsonl" 0 peak_rss_bytes) >> 20 )) MiB"
    done
  done

fi
summary() {  # label "a-values" "b-values" [more...]: medians per stage and the ratios to the first
  python3 - "$@" <<'PY'
import statistics, sys
label, groups = sys.argv[1], [[float(x) for x in g.split()] for g in sys.argv[2:]]
med = [statistics.median(g) for g in groups]
print(f"  {label}: " + ", ".join(f"{m:.0f} {g}" for m, g in zip(med, groups)) +
      " | ratios to the first: " + ", ".join(f"{m / med[0]:.3f}" for m in med[1:]))
PY
}
if [[ " $PARTS " == *" 2 "* ]]; then
  echo "2. tokens/s at stages 0 / 1 / 2 / 3, np 2, 1 thread per rank, $ROUNDS rounds interleaved"
  tps() {  # shape stage -> median tokens/s
    local out="$WORK/tps"; rm -rf "$out"
    local shape=(train.max_steps=30) first=5
    [ "$1" = small ] && shape=("${SMALL[@]}" data.seq_len=256 train.micro_batch=8 train.global_batch=32 train.max_steps=12) first=2
    launch 2 "$BUILD/bin/mllm-train" "$ROOT/recipes/mini.yaml" "${COMMON[@]}" "run.out_dir=$out" \
      "${shape[@]}" dist.zero_stage="$2" > "$WORK/tps.log" 2>&1 || { tail -5 "$WORK/tps.log" >&2; exit 1; }
    median "$out/metrics.jsonl" "$first" tokens_per_s
  }
  for shape in ${ZERO_BENCH_SHAPES:-mini small}; do
    s0=() s1=() s2=() s3=()
    tps "$shape" 0 > /dev/null  # prepares the data outside the timing
    for _ in $(seq 1 "$ROUNDS"); do
      s0+=("$(tps "$shape" 0)"); s1+=("$(tps "$shape" 1)"); s2+=("$(tps "$shape" 2)"); s3+=("$(tps "$shape" 3)")
    done
    summary "$shape, stage 0 / 1 / 2 / 3 tok/s" "${s0[*]}" "${s1[*]}" "${s2[*]}" "${s3[*]}"
  done
fi
if [[ " $PARTS " == *" 3 "* ]]; then
  echo "3. activation checkpointing, small shape, seq_len 1024, micro-batch 2, 1 rank x 2 threads"
  ac() {  # mode -> "peak_rss_MiB tokens_per_s"
    local out="$WORK/ac"; rm -rf "$out"
    "$BUILD/bin/mllm-train" "$ROOT/recipes/mini.yaml" "${COMMON[@]}" "run.out_dir=$out" "${SMALL[@]}" \
      data.seq_len=1024 train.micro_batch=2 train.global_batch=2 train.max_steps=8 train.threads=2 \
      model.activation_checkpointing="$1" > "$WORK/ac.log" 2>&1 || { tail -5 "$WORK/ac.log" >&2; exit 1; }
    echo "$(( $(median "$out/metrics.jsonl" 0 peak_rss_bytes) >> 20 )) $(median "$out/metrics.jsonl" 2 tokens_per_s)"
  }
  ac none > /dev/null
  mem_n=() mem_f=() tps_n=() tps_f=()
  for _ in $(seq 1 "$ROUNDS"); do
    read -r m t < <(ac none); mem_n+=("$m"); tps_n+=("$t")
    read -r m t < <(ac full); mem_f+=("$m"); tps_f+=("$t")
  done
  summary "peak RSS MiB, none / full" "${mem_n[*]}" "${mem_f[*]}"
  summary "tok/s, none / full" "${tps_n[*]}" "${tps_f[*]}"
fi
if [[ " $PARTS " == *" 4 "* ]]; then
  echo "4. ~530M-parameter llama, np 4, stage 3 + activation checkpointing, 1 thread per rank"
  out="$WORK/big"
  mpirun -np 4 --bind-to none --oversubscribe /usr/bin/time -f "rank peak RSS %M KiB, wall %e s" \
    "$BUILD/bin/mllm-train" "$ROOT/recipes/mini.yaml" "${COMMON[@]}" "run.out_dir=$out" \
    model.type=llama model.d_model=2048 model.n_heads=16 model.n_layers=10 model.d_ff=5632 \
    model.tie_embeddings=true model.dropout=0.0 data.seq_len=128 train.micro_batch=1 \
    train.global_batch=4 train.max_steps=3 model.activation_checkpointing=full dist.zero_stage=3 \
    > "$WORK/big.log" 2>&1 || { tail -20 "$WORK/big.log" >&2; exit 1; }
  grep -m1 -o "model llama: .*" "$out/logs/rank_00.log" | sed 's/^/  /'
  grep -m1 -o "memory per rank.*" "$out/logs/rank_00.log" | sed 's/^/  /'
  grep -o "step .*/3 .*" "$out/logs/rank_00.log" | sed 's/^/  /'
  grep "rank peak RSS" "$WORK/big.log" | sed 's/^/  /'
fi
