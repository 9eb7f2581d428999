#!/usr/bin/env bash
# Ours against PyTorch DDP on the same shape, ranks, threads and LibTorch, interleaved A B A B
# so that a change in the machine's load hits both alike. A benchmark, not a test.
#
#   bench/compare_pytorch.sh SHAPE NP [--rounds N] [--threads T] [--bf16] [--build DIR]
#                            [--python PY]
#
# SHAPE: mini | small, the peer's comparison shapes (../shared/peer/README.md):
#   mini:  vocab 4096, d_model 128, 4 heads, 2 layers, d_ff 256, seq 64, micro-batch 16, accum 1
#   small: vocab 8192, d_model 512, 8 heads, 8 layers, d_ff 2048, seq 256, micro-batch 8, accum 2
# NP ranks with T intra-op threads each (default: usable CPUs / NP, at least 1), N rounds
# (default 3). Ours trains on data/full/tang.jsonl with the character vocabulary capped at the
# shape's vocab (so the embedding and head have the peer's size); the peer (ddp_ref.py, gloo)
# trains on random ids. Both report the median per-step rate over the timed steps; the script
# prints every run and the ratio of medians (ours / PyTorch).
# PY (default: the project's .venv Python) must hold the torch mllm links (2.11); BUILD defaults
# to build/. Environment: MLLM_PEER_DIR (default <repo>/../shared/peer).
# Same BLAS code path: when mllm-train's start-up check corrects the BLAS (oneMKL's generic path
# on a non-Intel CPU, an OpenBLAS generic core; framework/mllm/core/blas.h), the peer runs with
# the same correction (LD_PRELOAD of libmllm_mkl_cpu.so, or OPENBLAS_CORETYPE), and the script
# prints the path both run. --peer-blas default leaves the peer on its library's own choice.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEER_DIR="${MLLM_PEER_DIR:-$ROOT/../shared/peer}"
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
[ "${1:-}" = -h ] || [ "${1:-}" = --help ] && { usage; exit 0; }
[ $# -ge 2 ] || { usage >&2; exit 2; }
SHAPE=$1 NP=$2; shift 2
ROUNDS=3 THREADS="" BF16=0 BUILD="$ROOT/build" PY="$ROOT/.venv/bin/python3" PEER_BLAS=same
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift ;;
    --threads) THREADS="$2"; shift ;;
    --bf16) BF16=1 ;;
    --build) BUILD="$2"; shift ;;
    --python) PY="$2"; shift ;;
    --peer-blas) PEER_BLAS="$2"; shift ;;
    *) echo "compare_pytorch.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case "$PEER_BLAS" in same|default) ;; *) echo "compare_pytorch.sh: --peer-blas must be same or default, not '$PEER_BLAS'" >&2; exit 2 ;; esac
case "$SHAPE" in mini|small) ;; *) echo "compare_pytorch.sh: SHAPE must be mini or small, not '$SHAPE'" >&2; exit 2 ;; esac
[[ "$NP" =~ ^[1-9][0-9]*$ ]] || { echo "compare_pytorch.sh: NP must be a positive integer, not '$NP'" >&2; exit 2; }
[ -x "$BUILD/bin/mllm-train" ] || { echo "compare_pytorch.sh: $BUILD/bin/mllm-train not found (--build)" >&2; exit 2; }
[ -f "$PEER_DIR/ddp_ref.py" ] || { echo "compare_pytorch.sh: no $PEER_DIR/ddp_ref.py (MLLM_PEER_DIR)" >&2; exit 2; }
"$PY" -c 'import torch' 2>/dev/null || { echo "compare_pytorch.sh: $PY has no torch (--python)" >&2; exit 2; }
CORPUS="$ROOT/data/full/tang.jsonl"
[ -f "$CORPUS" ] || { echo "compare_pytorch.sh: $CORPUS missing; run launch/fetch-corpus.sh" >&2; exit 2; }
if [ -z "$THREADS" ]; then
  cpus=$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
  THREADS=$(( cpus / NP > 0 ? cpus / NP : 1 ))
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS="$THREADS"
launch() { if [ "$NP" -eq 1 ]; then "$@"; else mpirun -np "$NP" --bind-to none --oversubscribe "$@"; fi; }

case "$SHAPE" in
  mini)  VOCAB=4096 D=128 H=4 L=2 FF=256 T=64 MB=16 ACC=1 STEPS=40 ;;
  small) VOCAB=8192 D=512 H=8 L=8 FF=2048 T=256 MB=8 ACC=2 STEPS=6 ;;
esac
PRECISION=fp32; PEER_BF16=()
[ "$BF16" = 1 ] && { PRECISION=bf16; PEER_BF16=(--bf16); }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mllm-compare.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

ours() {  # -> median tokens/s of the steps after the first 3
  local out="$WORK/ours"; rm -rf "$out"
  launch "$BUILD/bin/mllm-train" "$ROOT/recipes/mini.yaml" "data.corpus=[$CORPUS]" \
    "data.cache_dir=$WORK/cache" data.tokenizer.max_vocab=$VOCAB data.seq_len=$T \
    model.type=minillm model.d_model=$D model.n_heads=$H model.n_layers=$L model.d_ff=$FF \
    model.dropout=0.1 train.micro_batch=$MB train.global_batch=$((MB * ACC * NP)) \
    train.max_steps=$((STEPS + 3)) train.precision=$PRECISION train.threads=$THREADS \
    schedule.warmup_steps=10 eval.every_steps=0 "callbacks=[metrics]" checkpoint.resume=none \
    log.every_steps=1 "run.out_dir=$out" > "$WORK/ours.log" 2>&1 ||
    { tail -5 "$WORK/ours.log" >&2; echo "compare_pytorch.sh: mllm-train failed" >&2; exit 1; }
  python3 - "$out/metrics.jsonl" <<'PY'
import json, statistics, sys
v = [json.loads(l)["tokens_per_s"] for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
print(f"{statistics.median(v[3:]):.0f}")
PY
}
PEER_ENV=()
peer() {  # -> tokens per step / median step time, as for ours
  launch env "${PEER_ENV[@]}" "$PY" "$PEER_DIR/ddp_ref.py" --vocab $VOCAB --d-model $D --n-heads $H --n-layers $L \
    --d-ff $FF --seq-len $T --micro-batch $MB --accum $ACC --steps $STEPS --threads "$THREADS" \
    --port $((29500 + RANDOM % 1000)) "${PEER_BF16[@]}" > "$WORK/peer.log" 2>&1 ||
    { tail -5 "$WORK/peer.log" >&2; echo "compare_pytorch.sh: ddp_ref.py failed" >&2; exit 1; }
  python3 - "$WORK/peer.log" "$((NP * MB * ACC * T))" <<'PY'
import json, sys
o = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
print(f"{int(sys.argv[2]) / (o['step_ms_median'] / 1000):.0f}")
PY
}

echo "shape $SHAPE, $NP rank(s) x $THREADS thread(s), $PRECISION, $ROUNDS rounds; tokens/s (median step)"
A=() B=()
# Prepare the data once, outside the timing.
ours > /dev/null
blas=$(grep -m1 -o "BLAS .*code path.*" "$WORK/ours/logs/rank_00.log" || true)
echo "mllm:    ${blas:-no BLAS line in the log}"
if [ "$PEER_BLAS" = same ] && grep -q "corrected: .* -> " <<<"$blas"; then
  if grep -q -- "-> oneMKL" <<<"$blas"; then
    PEER_ENV=("LD_PRELOAD=$BUILD/framework/libmllm_mkl_cpu.so${LD_PRELOAD:+:$LD_PRELOAD}")
  else
    core=$(sed -E 's/.*-> OpenBLAS [^ ]+ ([A-Za-z0-9]+).*/\1/' <<<"$blas")
    PEER_ENV=("OPENBLAS_CORETYPE=$core")
  fi
fi
peer_path=$(env "${PEER_ENV[@]}" "$PY" -c '
import ctypes, os, torch
lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
try:
    b = lib.mkl_serv_cbwr_get_auto_branch()
    print(f"oneMKL CBWR branch {b} (mkl_cbwr.h: 2 generic, 10 AVX2, 12 AVX-512, 14 AVX-512 + VNNI/bf16)")
except AttributeError:
    print("BLAS " + torch.__config__.show().split("BLAS_INFO=")[-1].split(",")[0])
' 2>/dev/null || true)
echo "pytorch: ${PEER_ENV[*]:-library default}; ${peer_path:-path unknown}"
for round in $(seq 1 "$ROUNDS"); do
  a=$(ours); A+=("$a")
  b=$(peer); B+=("$b")
  printf 'round %s  mllm %8s   pytorch %8s\n' "$round" "$a" "$b"
done
python3 - "${A[*]}" "${B[*]}" <<'PY'
import statistics, sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"median: mllm {ma:,.0f} tokens/s, PyTorch DDP {mb:,.0f} tokens/s, ratio {ma / mb:.2f}x")
PY
