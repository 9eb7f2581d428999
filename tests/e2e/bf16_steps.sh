#!/usr/bin/env bash
# train.precision=bf16 (CPU autocast, float32 master weights and loss) with gradient accumulation:
# the losses must follow the float32 run of the same batches and the bf16 run without
# accumulation, step by step. Guards any bf16 weight-copy scheme against stale copies (the
# weights a step's forward uses must be the ones the previous optimizer step wrote), also with
# activation checkpointing.
source "$(dirname "$0")/common.sh"
common=(model.dropout=0.0 train.max_steps=10 train.global_batch=8 optim.lr=1e-2
        schedule.warmup_steps=0 eval.every_steps=0 checkpoint.every_steps=0 checkpoint.resume=none)
train 1 "$WORK/fp32" "${common[@]}" train.micro_batch=4 > "$WORK/fp32.log" 2>&1 || { tail "$WORK/fp32.log"; fail "fp32 run"; }
train 1 "$WORK/acc2" "${common[@]}" train.micro_batch=4 train.precision=bf16 > "$WORK/acc2.log" 2>&1 ||
  { tail "$WORK/acc2.log"; fail "bf16 run with accumulation 2"; }
train 1 "$WORK/acc1" "${common[@]}" train.micro_batch=8 train.precision=bf16 > "$WORK/acc1.log" 2>&1 ||
  { tail "$WORK/acc1.log"; fail "bf16 run without accumulation"; }
# The trainer keeps autocast's bf16 weight casts for all micro-batches of a step; checkpointed
# blocks (a forward without grad, a recomputation that clears the cache) must still give the
# same losses, bit for bit. On the path acc2 took (each run chooses from its own GEMM timing).
case "$(grep -o "bf16 products: [^(]*" "$WORK/acc2/logs/rank_00.log")" in
  *sgemm*) acc2_path=sgemm ;; *cblas_gemm_bf16bf16f32*) acc2_path=mkl ;; *) acc2_path=aten ;;
esac
MLLM_BF16_GEMM=$acc2_path train 1 "$WORK/ckpt" "${common[@]}" train.micro_batch=4 train.precision=bf16 \
  model.activation_checkpointing=every_n model.checkpoint_every=2 > "$WORK/ckpt.log" 2>&1 ||
  { tail "$WORK/ckpt.log"; fail "bf16 run with accumulation 2 and activation checkpointing"; }
python3 - "$WORK/fp32/metrics.jsonl" "$WORK/acc2/metrics.jsonl" "$WORK/acc1/metrics.jsonl" \
  "$WORK/ckpt/metrics.jsonl" <<'PY' || fail "bf16 losses"
import json, sys
def losses(p): return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
f32, acc2, acc1, ckpt = (losses(p) for p in sys.argv[1:])
assert ckpt == acc2, f"activation checkpointing changed the bf16 losses: {ckpt} vs {acc2}"
assert len(f32) == len(acc2) == len(acc1) == 10, (len(f32), len(acc2), len(acc1))
drop = f32[0] - f32[-1]
print("fp32      ", " ".join(f"{x:.4f}" for x in f32))
print("bf16 acc 2", " ".join(f"{x:.4f}" for x in acc2))
print("bf16 acc 1", " ".join(f"{x:.4f}" for x in acc1))
assert drop > 0.5, f"the float32 run should learn in 10 steps at lr 1e-2 (drop {drop:.3f})"
for i, (a, b, c) in enumerate(zip(f32, acc2, acc1), 1):
    # bf16 has 8 mantissa bits: per-step losses within 2% of float32 and of each other.
    assert abs(b - a) <= 0.02 * a, f"step {i}: bf16 {b} vs fp32 {a}"
    assert abs(b - c) <= 0.02 * c, f"step {i}: accumulation 2 {b} vs 1 {c}"
PY
# MLLM_BF16_GEMM (kernels/cpu/bf16_linear.h) picks what runs the bf16 products: "aten" ATen's bf16
# products (autocast's linear layers), "mkl" oneMKL's bf16 GEMM (ATen's where the CPU has no bf16
# units), "sgemm" float32 sgemm on the widened bf16 operands. All follow the default path step by
# step; the start-up line says which path runs; the forward of the default path is bit for bit
# that of the run pinned to the same path. Another value, and the retired MLLM_BF16_WEIGHT_GRAD,
# are bad input (exit 2).
for path in aten mkl sgemm; do
  MLLM_BF16_GEMM=$path train 1 "$WORK/$path" "${common[@]}" train.micro_batch=4 train.precision=bf16 \
    > "$WORK/$path.log" 2>&1 || { tail "$WORK/$path.log"; fail "bf16 run with MLLM_BF16_GEMM=$path"; }
done
# The sgemm path under activation checkpointing: the recomputation repeats the first pass (which
# runs without grad mode) bit for bit, as on the default path above.
MLLM_BF16_GEMM=sgemm train 1 "$WORK/sgemm_ckpt" "${common[@]}" train.micro_batch=4 \
  train.precision=bf16 model.activation_checkpointing=every_n model.checkpoint_every=2 \
  > "$WORK/sgemm_ckpt.log" 2>&1 || { tail "$WORK/sgemm_ckpt.log"; fail "sgemm run with activation checkpointing"; }
[ "$(field "$WORK/sgemm_ckpt/metrics.jsonl" loss)" = "$(field "$WORK/sgemm/metrics.jsonl" loss)" ] ||
  fail "activation checkpointing changed the sgemm path's losses"
grep -q "bf16 products: ATen's bf16 products" "$WORK/aten/logs/rank_00.log" ||
  fail "MLLM_BF16_GEMM=aten: no start-up line for ATen's path"
grep -q "bf16 products: oneMKL's float32 sgemm on the bf16 operands widened" "$WORK/sgemm/logs/rank_00.log" ||
  fail "MLLM_BF16_GEMM=sgemm: no start-up line for the sgemm path"
# On the sgemm path the products run on the fp32 units: the MFU peak is the measured fp32 rate.
python3 - "$WORK/sgemm/logs/rank_00.log" <<'PY' || fail "the sgemm path's MFU peak"
import re, sys
log = open(sys.argv[1], encoding="utf-8").read()
peak = re.search(r"MFU peak ([0-9.]+) GFLOP/s = measured fp32 GEMM .*; it runs bf16's products here", log)
assert peak, "no MFU peak line naming the fp32 GEMM"
gemm = re.search(r"CPU GEMM: bf16 [0-9.]+ GFLOP/s, fp32 ([0-9.]+) GFLOP/s .*bf16's products run as "
                 r"float32 GEMMs here", log)
assert gemm, "no CPU GEMM line for the sgemm path"
assert abs(float(peak.group(1)) - float(gemm.group(1))) <= 0.1, (peak.group(0), gemm.group(0))
PY
default_line=$(grep -o "bf16 products: [^(]*" "$WORK/acc2/logs/rank_00.log") || fail "no bf16 products line"
echo "default: $default_line"
case "$default_line" in
  *sgemm*) same_forward=sgemm ;; *cblas_gemm_bf16bf16f32*) same_forward=mkl ;; *) same_forward=aten ;;
esac
python3 - "$WORK/acc2/metrics.jsonl" "$WORK/aten/metrics.jsonl" "$WORK/sgemm/metrics.jsonl" \
  "$WORK/mkl/metrics.jsonl" "$same_forward" <<'PY' || fail "bf16 paths"
import json, sys
a, b, c, d = ([json.loads(l)["loss"] for l in open(f) if '"loss"' in l] for f in sys.argv[1:5])
print("aten      ", " ".join(f"{x:.4f}" for x in b))
print("sgemm     ", " ".join(f"{x:.4f}" for x in c))
print("mkl       ", " ".join(f"{x:.4f}" for x in d))
# The first step's loss comes before any gradient: the default path's forward, bit for bit that
# of the run pinned to the same path.
same = {"aten": b, "sgemm": c, "mkl": d}[sys.argv[5]]
assert a[0] == same[0], (a[0], same[0], sys.argv[5])
# sgemm's and oneMKL's forward against ATen's: the same bf16 products summed in another order
# (float32 sums), and the fused attention's float32 scores (oneMKL's linear layers give ATen's
# bits: oneDNN's fused product); the loss of 8 sequences moves by far less than one bf16
# rounding.
assert abs(c[0] - b[0]) <= 1e-3 * b[0], (c[0], b[0])
assert abs(d[0] - b[0]) <= 1e-3 * b[0], (d[0], b[0])
assert len(b) == len(c) == len(d) == 10, (len(b), len(c), len(d))
for i, (x, y, z, w) in enumerate(zip(a, b, c, d), 1):
    assert abs(x - y) <= 0.02 * y, f"step {i}: {x} vs ATen's path {y}"
    assert abs(z - y) <= 0.02 * y, f"step {i}: sgemm {z} vs ATen's path {y}"
    assert abs(w - y) <= 0.02 * y, f"step {i}: mkl {w} vs ATen's path {y}"
PY
# The default path follows docs/precision.md's rule from the rates the log shows: AMX -> oneMKL's
# bf16 GEMM; else bf16 below 0.8 of fp32 -> sgemm; else avx512_bf16 with oneMKL's bf16 GEMM at
# 0.9 or more of ATen's -> oneMKL's; else ATen's. oneMKL's rate is timed only where that rule
# reads it (avx512_bf16 without AMX, MLLM_BF16_GEMM unset). Rates within 1% of a threshold are
# not judged (the log rounds them to 0.1 GFLOP/s).
python3 - "$WORK/acc2/logs/rank_00.log" <<'PY' || fail "the default bf16 path's rule"
import re, sys
log = open(sys.argv[1], encoding="utf-8").read()
m = re.search(r"CPU GEMM: bf16 ([0-9.]+) GFLOP/s, fp32 ([0-9.]+) GFLOP/s \(bf16 / fp32 = [0-9.]+; "
              r"(?:oneMKL's bf16 GEMM ([0-9.]+) GFLOP/s; )?([^)]*)\)", log)
if not m:
    assert re.search(r"CPU GEMM: fp32 [0-9.]+ GFLOP/s; no bf16 units", log), "no CPU GEMM line"
    sys.exit(0)
bf16, fp32, mkl, flags = float(m[1]), float(m[2]), float(m[3] or 0), m[4]
amx, avx = " amx_bf16" in flags, " avx512_bf16" in flags
assert mkl == 0 or (avx and not amx), f"oneMKL's bf16 GEMM timed where the rule does not read it: {m[0]}"
line = re.search(r"bf16 products: (.*)", log)[1]
chosen = ("sgemm" if line.startswith("oneMKL's float32 sgemm") else
          "mkl" if line.startswith("oneMKL's cblas_gemm_bf16bf16f32") else "aten")
near = abs(bf16 / fp32 - 0.8) < 0.01 or (mkl > 0 and abs(mkl / bf16 - 0.9) < 0.01)
want = ("mkl" if amx else "sgemm" if bf16 < 0.8 * fp32 else
        "mkl" if avx and mkl >= 0.9 * bf16 else "aten")
print(f"rule: bf16 {bf16}, fp32 {fp32}, oneMKL bf16 {mkl}, amx {amx} -> {want}; chosen {chosen}")
# A path whose function libtorch_cpu.so does not export falls back to ATen's, and says so.
fell_back = chosen == "aten" and "exports no" in line
assert near or fell_back or chosen == want, f"chose {chosen}, the rule says {want}: {m[0]}; {line}"
PY
set +e
MLLM_BF16_GEMM=fast train 1 "$WORK/badenv" "${common[@]}" train.precision=bf16 > "$WORK/badenv.log" 2>&1
rc=$?
MLLM_BF16_WEIGHT_GRAD=aten train 1 "$WORK/oldenv" "${common[@]}" train.precision=bf16 > "$WORK/oldenv.log" 2>&1
rc_old=$?
# Ranks on different paths would round differently: refused at start-up (exit 2), on every rank.
args=("$RECIPE" "run.out_dir=$WORK/mixed" "data.cache_dir=$CACHE" "data.corpus=[$CORPUS]"
      "${common[@]}" train.precision=bf16)
mpirun --bind-to none -np 1 -x MLLM_BF16_GEMM=aten "$MLLM_BIN/mllm-train" "${args[@]}" : \
  -np 1 -x MLLM_BF16_GEMM=sgemm "$MLLM_BIN/mllm-train" "${args[@]}" > "$WORK/mixed.log" 2>&1
rc_mixed=$?
set -e
[ $rc_mixed -eq 2 ] || { tail "$WORK/mixed.log"; fail "ranks on different bf16 paths: exit $rc_mixed, expected 2"; }
grep -q "rank 1 runs bf16's products with oneMKL's float32 sgemm.*rank 0 with ATen's bf16 products.*set MLLM_BF16_GEMM alike on every rank" "$WORK/mixed.log" ||
  fail "ranks on different bf16 paths: $(tail -3 "$WORK/mixed.log")"
[ $rc -eq 2 ] || { tail "$WORK/badenv.log"; fail "MLLM_BF16_GEMM=fast: exit $rc, expected 2"; }
grep -q "MLLM_BF16_GEMM must be unset, mkl, sgemm or aten, not 'fast'" "$WORK/badenv.log" ||
  fail "MLLM_BF16_GEMM=fast: $(tail -3 "$WORK/badenv.log")"
[ $rc_old -eq 2 ] || { tail "$WORK/oldenv.log"; fail "MLLM_BF16_WEIGHT_GRAD=aten: exit $rc_old, expected 2"; }
grep -q "MLLM_BF16_WEIGHT_GRAD was renamed MLLM_BF16_GEMM" "$WORK/oldenv.log" ||
  fail "MLLM_BF16_WEIGHT_GRAD=aten: $(tail -3 "$WORK/oldenv.log")"
echo PASS
