#!/usr/bin/env bash
# launch/gpu-check.sh on the CPU (MLLM_GPU_CHECK_DEVICE=cpu, tiny shapes, the programs ctest
# built): every check after the build runs and passes, the report says what each compared, and
# its verdicts can fail: a run on the wrong backend and a loss off by 1e-3 each turn it red.
source "$(dirname "$0")/../e2e/common.sh"
: "${MLLM_TORCH_PYTHON:?set by ctest: the Python holding the torch we link}"
G="$MLLM_SOURCE_DIR/launch/gpu-check.sh"
export MLLM_GPU_CHECK_DEVICE=cpu PYTHON="$MLLM_TORCH_PYTHON"

# ---- every check ---------------------------------------------------------------------------
"$G" "$WORK/ok" > "$WORK/ok.out" 2>&1 || { cat "$WORK/ok.out"; fail "gpu-check on the CPU did not pass"; }
python3 - "$WORK/ok" <<'PY' || fail "the report of the passing run"
import json, sys
out = sys.argv[1]
rep = json.load(open(f"{out}/report.json"))
by = {r["check"]: r for r in rep["checks"]}
want = ["build", "gpu_tests", "sync_debug", "observe", "mini", "fp32_vs_cpu", "fp32_parity", "np2_vs_np1",
        "llama_np1", "reference", "bf16_parity", "hf_export", "speed", "mfu"]
assert [r["check"] for r in rep["checks"]] == want, [r["check"] for r in rep["checks"]]
assert rep["passed"] is True and rep["device"] == "cpu", rep
assert by["build"]["status"] == "skipped" and by["gpu_tests"]["status"] == "skipped"
assert by["speed"]["status"] == "info" and by["sync_debug"]["status"] == "info"
# Each run named the backend it was meant to use.
assert by["np2_vs_np1"]["backend_np1"]["backend"] == "single", by["np2_vs_np1"]
assert by["np2_vs_np1"]["backend_np2"]["backend"] == "mpi", by["np2_vs_np1"]
assert by["np2_vs_np1"]["backend_np2"]["world_size"] == 2
assert by["mini"]["cpu_backend"]["backend"] == "mpi" and by["llama_np1"]["backend"]["backend"] == "single"

# The comparisons, recomputed here from the runs' own metrics.jsonl files.
def losses(run):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{out}/{run}/metrics.jsonl")) if "tokens_per_s" in r}
a, b = losses("np1"), losses("np2")
assert sorted(a) == sorted(b) == list(range(1, 9)), (a, b)
diff = max(abs(a[s] - b[s]) for s in a)
assert diff <= 1e-5 and abs(by["np2_vs_np1"]["max_loss_diff"] - diff) < 1e-12, (diff, by["np2_vs_np1"])
assert by["np2_vs_np1"]["steps"] == 8 and by["np2_vs_np1"]["tolerance"] == 1e-5
z = losses("np1_zero1")
assert sorted(z) == sorted(a) and max(abs(a[s] - z[s]) for s in a) <= 1e-5, (a, z)
assert by["np2_vs_np1"]["zero1_vs_np1"]["ok"] is True and by["np2_vs_np1"]["backend_zero1"]["ok"]
z2 = losses("np1_zero2_ac")
assert sorted(z2) == sorted(a) and max(abs(a[s] - z2[s]) for s in a) <= 1e-5, (a, z2)
assert by["np2_vs_np1"]["zero2_ac_vs_np1"]["ok"] is True, by["np2_vs_np1"]
z3 = losses("np1_zero3_ac")
assert sorted(z3) == sorted(a) and max(abs(a[s] - z3[s]) for s in a) <= 1e-5, (a, z3)
assert by["np2_vs_np1"]["zero3_ac_vs_np1"]["ok"] is True, by["np2_vs_np1"]
g, c = losses("fp32_gpu"), losses("fp32_cpu")
assert len(g) == 10 and max(abs(g[s] - c[s]) for s in g) <= 1e-4
assert abs(by["fp32_parity"]["ours"] - by["fp32_parity"]["reference"]) <= 1e-5, by["fp32_parity"]
assert abs(by["mini"]["val_loss"] - by["mini"]["cpu_val_loss"]) <= 0.02, by["mini"]
# No GPU, no host synchronisation to find: an empty list, from a report that exists.
sd = json.load(open(f"{out}/sync_debug/sync_debug.json"))
assert sd["steps"] == 5 and sd["total"] == 0 and sd["sites"] == [] and sd["device"] == "cpu", sd
# The trace of steps 4-5 holds the named ranges (no CUDA kernels on the CPU), one events file.
o = by["observe"]
assert o["status"] == "pass" and o["kernels"] == 0 and {"forward", "step 4", "step 5"} <= set(o["ranges"]), o
md = open(f"{out}/report.md").read()
assert "verdict: PASS" in md and "| np2_vs_np1 | pass |" in md, md
print("gpu_check_cpu: all", len(want), "checks; np2 vs np1 max |loss diff|", diff)
PY

# ---- verdicts that can fail ----------------------------------------------------------------
# The 1-rank run on another backend than the one it was meant to use (an MPI singleton instead of
# single; on a GPU: mpi instead of nccl) is a failure, even though its losses agree.
if MLLM_GPU_CHECK_ONLY=np2_vs_np1 MLLM_GPU_CHECK_OVERRIDES_np1="dist.backend=mpi" MLLM_BIN="$MLLM_BIN" \
   "$G" "$WORK/backend" > "$WORK/backend.out" 2>&1; then
  cat "$WORK/backend.out"; fail "a run on the wrong backend passed"
fi
# A loss off by 1e-3 at one step of the 2-rank run.
if MLLM_GPU_CHECK_ONLY=np2_vs_np1 MLLM_GPU_CHECK_FAULT_np2="skew:step=4:by=1e-3" MLLM_BIN="$MLLM_BIN" \
   "$G" "$WORK/skew" > "$WORK/skew.out" 2>&1; then
  cat "$WORK/skew.out"; fail "a loss off by 1e-3 passed"
fi
python3 - "$WORK/backend" "$WORK/skew" <<'PY' || fail "the reports of the failing runs"
import json, sys
back = {r["check"]: r for r in json.load(open(f"{sys.argv[1]}/report.json"))["checks"]}
skew = {r["check"]: r for r in json.load(open(f"{sys.argv[2]}/report.json"))["checks"]}
assert list(back) == ["build", "np2_vs_np1"] and list(skew) == ["build", "np2_vs_np1"], (back, skew)
b = back["np2_vs_np1"]
assert b["status"] == "fail" and b["backend_np1"] == {"backend": "mpi", "want": "single", "ok": False,
                                                        "world_size": 1}, b
assert b["max_loss_diff"] <= 1e-5, b  # the numbers agreed: only the backend was wrong
s = skew["np2_vs_np1"]
assert s["status"] == "fail" and abs(s["max_loss_diff"] - 1e-3) < 1e-5 and s["why"].startswith("step 4:"), s
assert json.load(open(f"{sys.argv[2]}/report.json"))["passed"] is False
print("gpu_check_cpu: wrong backend and skewed loss both fail:", b["backend_np1"], s["why"])
PY
# ---- the bench (launch/gpu-bench.sh): sync_debug, then the four ways of the bench shape ----------
MLLM_BIN="$MLLM_BIN" "$MLLM_SOURCE_DIR/launch/gpu-bench.sh" "$WORK/bench" > "$WORK/bench.out" 2>&1 ||
  { cat "$WORK/bench.out"; fail "gpu-bench on the CPU did not pass"; }
python3 - "$WORK/bench" "$MLLM_SOURCE_DIR/launch/gpu_check_report.py" <<'PY' || fail "the bench report"
import json, re, subprocess, sys
out, tool = sys.argv[1], sys.argv[2]
rep = json.load(open(f"{out}/report.json"))
by = {r["check"]: r for r in rep["checks"]}
want = ["build", "sync_debug", "bench_mllm_eager", "bench_mllm_graphs", "bench_torch_eager",
        "bench_torch_compile", "bench_summary"]
assert [r["check"] for r in rep["checks"]] == want, [r["check"] for r in rep["checks"]]
assert rep["passed"] is True, rep
m, e, c, s = (by[k] for k in ("bench_mllm_eager", "bench_torch_eager", "bench_torch_compile", "bench_summary"))
assert m["status"] == "info" and m["backend"]["backend"] == "single" and m["tokens_per_s"] > 0, m
# The profiled window of mllm's run: 2 steps of CPU ops, no device kernels on the CPU.
assert m["profiled_steps"] == 2 and m["kernels_per_step"] == 0 and m["cpu_ops_per_step"] > 50, m
assert by["bench_mllm_graphs"]["status"] == "skipped"
for r in (e, c):  # the same model in PyTorch: the same parameter count as mllm's log gives
    assert r["status"] == "info" and r["params"] == r["mllm_params"] > 0 and r["tokens_per_s"] > 0, r
    assert r["cpu_ops_per_step"] > 50 and r["profiled_steps"] == 2 and r["bf16"] is True, r
assert e["compile"] is False and c["compile"] == "aot_eager", (e, c)  # TorchInductor on the GPU
# MFU against mllm's measured peak: achieved TFLOP/s over the peak of mllm's start-up line.
# The same FLOPs per token as mllm's log gives (model.h's convention), so MFU compares.
flops = int(re.search(r"model llama: \d+ parameters, (\d+) FLOPs per token", open(f"{out}/bench_mllm.log").read())[1])
for r in (e, c):
    assert 0 < r["mfu"] < 1 and r["flops_per_token"] == flops, (r, flops)
# The summary's ratios, recomputed from the rows.
assert s["mllm_best"] == "mllm_eager" and s["mfu_target"] == 0.40, s
assert abs(s["vs_torch_compile"] - m["tokens_per_s"] / c["tokens_per_s"]) < 1e-3, s
assert abs(s["vs_torch_eager"] - m["tokens_per_s"] / e["tokens_per_s"]) < 1e-3, s
md = open(f"{out}/report.md").read()
assert "## The bench shape, side by side (bench_summary)" in md and "| torch_compile |" in md, md

# trace-kernels on a hand-made CUDA trace: 2 steps, 3 kernels of known durations, a copy, a fill.
ev = [{"ph": "X", "cat": "kernel", "name": "gemm", "dur": 30.0},
      {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 50.0},
      {"ph": "X", "cat": "kernel", "name": "softmax", "dur": 20.0},
      {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "dur": 5.0},
      {"ph": "X", "cat": "gpu_memset", "name": "Memset", "dur": 1.0},
      {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 9.0},
      {"ph": "i", "cat": "kernel", "name": "not a span"}]
json.dump({"traceEvents": ev}, open(f"{out}/hand.json", "w"))
k = json.loads(subprocess.run([sys.executable, tool, "trace-kernels", f"{out}/hand.json", "2"],
                              capture_output=True, text=True, check=True).stdout)
assert k["kernels_per_step"] == 1.5 and k["copies_per_step"] == 1.0 and k["cpu_ops_per_step"] == 0.5, k
assert k["kernel_ms_per_step"] == 0.05, k  # (30 + 50 + 20) us / 2 steps
assert [t["name"] for t in k["top_kernels"]] == ["gemm", "softmax"], k
assert k["top_kernels"][0] == {"name": "gemm", "ms_per_step": 0.04, "calls_per_step": 1.0, "share": 0.8}, k
print("gpu_check_cpu: bench rows", {w: v["tokens_per_s"] for w, v in s["ways"].items()})
PY

echo "gpu_check_cpu: ok"
