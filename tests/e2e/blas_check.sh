#!/usr/bin/env bash
# The start-up BLAS check (framework/mllm/core/blas.h) under a plain mpirun: made to believe the
# BLAS runs a generic path (MLLM_BLAS_TEST=generic), every rank re-executes itself with the
# correction, verifies it and logs the path it moved to; a correction whose check GEMM is wrong is
# undone with a warning and the run still trains; MLLM_BLAS_CORE=keep keeps the default with a
# warning saying how to correct it; a bad MLLM_BLAS_CORE is bad input (exit 2).
source "$(dirname "$0")/common.sh"
python3 - <<'PY' || { echo "SKIP: this CPU has neither AVX2 + FMA nor AVX-512: nothing to correct"; exit 0; }
import sys
flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
sys.exit(0 if {"avx2", "fma"} <= set(flags) else 1)
PY
ARGS=(train.max_steps=3 checkpoint.every_steps=0 eval.every_steps=0 model.n_layers=1 model.d_model=16)

# blas_line RUN RANK: the BLAS line of that rank's log.
blas_line() { grep -m1 -E "BLAS .*code path" "$1/logs/rank_0$2.log" || fail "no BLAS line in $1 rank $2"; }

MLLM_BLAS_TEST=generic train 2 "$WORK/fixed" "${ARGS[@]}" >"$WORK/fixed.out" 2>&1 || { cat "$WORK/fixed.out"; fail "corrected run"; }
for r in 0 1; do
  line=$(blas_line "$WORK/fixed" $r)
  echo "rank $r: $line"
  grep -q "corrected: .*generic" <<<"$line" || fail "rank $r did not correct the forced generic path: $line"
  grep -qE -- "-> (oneMKL|OpenBLAS) [^;]*(AVX2|AVX-512|Haswell|SkylakeX|Cooperlake|SapphireRapids)" <<<"$line" \
    || fail "rank $r: the corrected path is not a vector path: $line"
  grep -qE "max relative error [0-9.]+e-0[5-9]" <<<"$line" || fail "rank $r: no passing GEMM check: $line"
done
grep -q "MFU peak .* usable core(s) of each node.*summed over 1 node(s)" "$WORK/fixed/logs/rank_00.log" || fail "no MFU peak line"

MLLM_BLAS_TEST=generic MLLM_BLAS_CORE=keep train 1 "$WORK/keep" "${ARGS[@]}" >"$WORK/keep.out" 2>&1 || fail "keep run"
line=$(blas_line "$WORK/keep" 0)
grep -q "kept because MLLM_BLAS_CORE=keep (unset it to correct this)" <<<"$line" || fail "keep: $line"
grep -q "\[warning\].*BLAS" "$WORK/keep/logs/rank_00.log" || fail "keep: not a warning"

# The check GEMM fails: back to the library's own choice, loudly, and the run trains to the end.
MLLM_BLAS_TEST=generic,bad-gemm train 1 "$WORK/bad" "${ARGS[@]}" >"$WORK/bad.out" 2>&1 || { cat "$WORK/bad.out"; fail "bad-gemm run"; }
line=$(blas_line "$WORK/bad" 0)
grep -q "the BLAS correction was undone: a 256x256 fp32 GEMM had max relative error 1.00e+00" <<<"$line" \
  || fail "bad-gemm: $line"
grep -q "\[warning\].*BLAS" "$WORK/bad/logs/rank_00.log" || fail "bad-gemm: not a warning"
[ "$(python3 -c 'import json;print(sum(1 for l in open("'"$WORK/bad/metrics.jsonl"'") if "loss" in json.loads(l)))')" = 3 ] \
  || fail "bad-gemm: the run did not train 3 steps"

set +e
MLLM_BLAS_CORE=off train 1 "$WORK/badenv" "${ARGS[@]}" >"$WORK/badenv.out" 2>&1
rc=$?
set -e
[ $rc -eq 2 ] || fail "MLLM_BLAS_CORE=off: exit $rc, expected 2"
grep -q "MLLM_BLAS_CORE=off: expected 'keep'" "$WORK/badenv.out" || fail "MLLM_BLAS_CORE=off: $(cat "$WORK/badenv.out")"
echo PASS
