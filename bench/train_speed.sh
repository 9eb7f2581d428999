#!/usr/bin/env bash
# CPU training speed of one rank for the peer's two comparison shapes (../shared/peer/README.md):
#   mini:  d_model 128, 4 heads, 2 layers, d_ff 256, seq 64, micro-batch 16, accumulation 1
#   small: d_model 512, 8 heads, 8 layers, d_ff 2048, seq 256, micro-batch 8, accumulation 2
# for several mllm builds (mllm-train on the committed tang300 sample, character vocabulary) and
# optionally the PyTorch peer (ddp_ref.py, random tokens, vocab 4096 / 8192) under several
# Pythons, interleaved round by round so that a change in the machine's load hits all alike.
# Prints one line per run and a table of median tokens/s. A benchmark, not a test.
#
#   bench/train_speed.sh [--rounds N] [--threads T] [--shapes mini,small]
#                        [--peer PYTHON]... BUILD_DIR...
# Example (LibTorch 2.11 build vs a Debian 1.13 build, and the peer on both torches):
#   bench/train_speed.sh --peer .venv/bin/python3 --peer /usr/bin/python3 build /tmp/old/build
# Environment: MLLM_PEER_DIR (default <repo>/../shared/peer).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEER_DIR="${MLLM_PEER_DIR:-$ROOT/../shared/peer}"
ROUNDS=3 THREADS=2 SHAPES=mini,small
BUILDS=() PEERS=()
usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift ;;
    --threads) THREADS="$2"; shift ;;
    --shapes) SHAPES="$2"; shift ;;
    --peer) PEERS+=("$2"); shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "train_speed.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) [ -x "$1/bin/mllm-train" ] || { echo "train_speed.sh: $1/bin/mllm-train not found" >&2; exit 2; }
       BUILDS+=("$(cd "$1" && pwd)") ;;
  esac
  shift
done
[ ${#BUILDS[@]} -gt 0 ] || [ ${#PEERS[@]} -gt 0 ] || { usage >&2; exit 2; }
for py in "${PEERS[@]}"; do
  [ -f "$PEER_DIR/ddp_ref.py" ] || { echo "train_speed.sh: no $PEER_DIR/ddp_ref.py" >&2; exit 2; }
  "$py" -c 'import torch' 2>/dev/null || { echo "train_speed.sh: $py has no torch" >&2; exit 2; }
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/mllm-speed.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
RESULTS="$WORK/results.tsv"

# mllm-train overrides and peer flags per shape.
common=(data.corpus="[$ROOT/data/tang300/tang300.jsonl]" data.val_fraction=0.05 data.mode=packed
        model.type=minillm model.dropout=0.1 optim.grad_clip=1.0 schedule.warmup_steps=2
        eval.every_steps=0 eval.batches=1 sample.every_steps=0 sample.max_new_tokens=1
        checkpoint.every_steps=0 checkpoint.resume=none train.precision=fp32 train.threads="$THREADS")
mllm_shape() {
  case "$1" in
    mini) echo model.d_model=128 model.n_heads=4 model.n_layers=2 model.d_ff=256 data.seq_len=64 \
               train.micro_batch=16 train.global_batch=16 train.max_steps=60 log.every_steps=10 ;;
    small) echo model.d_model=512 model.n_heads=8 model.n_layers=8 model.d_ff=2048 data.seq_len=256 \
                train.micro_batch=8 train.global_batch=16 train.max_steps=7 log.every_steps=1 ;;
  esac
}
peer_shape() {
  case "$1" in
    mini) echo --vocab 4096 --d-model 128 --n-heads 4 --n-layers 2 --d-ff 256 --seq-len 64 \
               --micro-batch 16 --accum 1 --steps 30 ;;
    small) echo --vocab 8192 --d-model 512 --n-heads 8 --n-layers 8 --d-ff 2048 --seq-len 256 \
                --micro-batch 8 --accum 2 --steps 6 ;;
  esac
}

run_mllm() {  # BUILD SHAPE -> tokens/s: the median of the logged steps after the first
  local build=$1 shape=$2 tag out
  tag="$(echo "$build" | md5sum | cut -c1-8)"
  out="$WORK/run-$tag-$shape"
  rm -rf "$out"
  # shellcheck disable=SC2046
  OMP_NUM_THREADS="$THREADS" "$build/bin/mllm-train" "$ROOT/recipes/mini.yaml" "${common[@]}" \
    $(mllm_shape "$shape") run.out_dir="$out" data.cache_dir="$WORK/cache-$tag-$shape" \
    > "$out.log" 2>&1 || { echo "train_speed.sh: mllm-train failed, see below" >&2; tail -5 "$out.log" >&2; exit 1; }
  python3 - "$out/metrics.jsonl" <<'PY'
import json, statistics, sys
v = [json.loads(l)["tokens_per_s"] for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
print(f"{statistics.median(v[1:] or v):.0f}")
PY
}
run_peer() {  # PYTHON SHAPE -> tokens/s as ddp_ref.py reports it
  local py=$1 shape=$2
  # shellcheck disable=SC2046
  "$py" "$PEER_DIR/ddp_ref.py" $(peer_shape "$shape") --threads "$THREADS" 2>/dev/null |
    python3 -c 'import json, sys; print(round(json.loads(sys.stdin.read().split("\n")[-2])["tokens_per_s"]))'
}

IFS=, read -r -a shape_list <<< "$SHAPES"
for round in $(seq 1 "$ROUNDS"); do
  for shape in "${shape_list[@]}"; do
    for build in "${BUILDS[@]}"; do
      tps=$(run_mllm "$build" "$shape")
      printf 'round %s  %-5s  mllm %-40s %8s tok/s\n' "$round" "$shape" "$build" "$tps"
      printf 'mllm %s\t%s\t%s\n' "$build" "$shape" "$tps" >> "$RESULTS"
    done
    for py in "${PEERS[@]}"; do
      tps=$(run_peer "$py" "$shape")
      printf 'round %s  %-5s  peer %-40s %8s tok/s\n' "$round" "$shape" "$py" "$tps"
      printf 'peer %s\t%s\t%s\n' "$py" "$shape" "$tps" >> "$RESULTS"
    done
  done
done

echo
python3 - "$RESULTS" "$THREADS" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    who, shape, tps = line.rstrip("\n").split("\t")
    rows[(who, shape)].append(float(tps))
print(f"| run ({sys.argv[2]} threads, 1 rank) | shape | median tokens/s | runs |")
print("|---|---|---:|---:|")
for (who, shape), v in rows.items():
    print(f"| {who} | {shape} | {statistics.median(v):,.0f} | {len(v)} |")
PY
