#!/usr/bin/env python3
"""The verdicts and the report of launch/gpu-check.sh (standard-library Python only).

    gpu_check_report.py record OUT CHECK STATUS [KEY=JSON ...]   a row; rewrites report.json/.md
    gpu_check_report.py metrics RUN                               tokens/s, MFU, losses of a run
    gpu_check_report.py compare RUN_A RUN_B TOL [--steps N]       losses step by step
    gpu_check_report.py backend LOG WANT                          the backend a run's log names
    gpu_check_report.py sync-debug RUN                            a run's sync_debug.json, summed up
    gpu_check_report.py ref-value FILE KEY                        KEY of the last JSON line of FILE
    gpu_check_report.py trace-kernels TRACE STEPS [TOP]           kernels per step of a Chrome trace
    gpu_check_report.py bench-summary OUT                         the bench rows side by side

Every subcommand that judges prints one JSON object; `compare` and `backend` exit 1 when the
verdict is a failure, so the shell can branch on them. `record` appends to OUT/results.jsonl and
then writes OUT/report.json and OUT/report.md from every row so far: a check that never finishes
(a timeout) leaves the verdicts before it. A value that is not valid JSON is stored as a string.
"""
import json
import math
import os
import re
import statistics
import subprocess
import sys


def load_rows(path):
    rows = []
    if os.path.exists(path):
        for line in open(path, encoding="utf-8"):
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def metrics_rows(run):
    path = os.path.join(run, "metrics.jsonl")
    rows = [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]
    train = [r for r in rows if "tokens_per_s" in r]
    evals = [r for r in rows if "val_loss" in r]
    return train, evals


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def cmd_metrics(run):
    train, evals = metrics_rows(run)
    # The first logged step holds start-up costs (kernels, allocator): left out of speed figures.
    steady = train[1:] or train
    out = {
        "steps": len(train),
        "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in steady)) if steady else None,
        "mfu": round(statistics.median(r["mfu"] for r in steady), 4) if steady and "mfu" in steady[0] else None,
        "loss_first": train[0]["loss"] if train else None,
        "loss_last": train[-1]["loss"] if train else None,
        "val_loss": evals[-1]["val_loss"] if evals else None,
    }
    print(json.dumps(out))
    return 0


def cmd_compare(run_a, run_b, tol, steps=None):
    """Step-by-step train losses of two runs: same steps logged, every |a - b| <= tol."""
    a = {r["step"]: r["loss"] for r in metrics_rows(run_a)[0]}
    b = {r["step"]: r["loss"] for r in metrics_rows(run_b)[0]}
    common = sorted(set(a) & set(b))
    why = ""
    if steps is not None and (len(a) != steps or len(b) != steps):
        why = f"expected {steps} logged steps, got {len(a)} and {len(b)}"
    elif not common or set(a) != set(b):
        why = f"the runs logged different steps: {sorted(a)} vs {sorted(b)}"
    diffs = [abs(a[s] - b[s]) for s in common if finite(a[s]) and finite(b[s])]
    if not why and len(diffs) != len(common):
        why = "a loss is not finite"
    worst = max(diffs) if diffs else None
    if not why and worst > tol:
        step = max(common, key=lambda s: abs(a[s] - b[s]))
        why = f"step {step}: {a[step]!r} vs {b[step]!r}"
    out = {"max_loss_diff": worst, "tolerance": tol, "steps": len(common), "ok": not why}
    if why:
        out["why"] = why
    print(json.dumps(out))
    return 0 if not why else 1


def cmd_backend(log, want):
    """The backend the trainer's start-up line names, '(<backend> backend' in
    'run NAME: world size N (<backend> backend...)'; ok when it is `want`."""
    seen = None
    for line in open(log, encoding="utf-8", errors="replace"):
        m = re.search(r"world size (\d+) \(([a-z ]+?) backend", line)
        if m:
            seen = m.group(2)
            world = int(m.group(1))
            break
    out = {"backend": seen, "want": want, "ok": seen == want}
    if seen is not None:
        out["world_size"] = world
    for line in open(log, encoding="utf-8", errors="replace"):
        m = re.search(r"(NCCL \d+\.\d+\.\d+[^,\n]*)", line)  # "NCCL 2.28.9 (CUDA runtime 13000)"
        if m:
            out["nccl"] = m.group(1).strip()
            break
    print(json.dumps(out))
    return 0 if out["ok"] else 1


def cmd_sync_debug(run):
    path = os.path.join(run, "sync_debug.json")
    if not os.path.exists(path):
        print(json.dumps({"ok": False, "why": f"no {path}"}))
        return 1
    rep = json.load(open(path, encoding="utf-8"))
    sites = [{"per_step": round(s["per_step"], 2), "phase": s["phase"],
              "op": s["op_frame"] or "?", "from": s["mllm_frame"] or "?"} for s in rep["sites"]]
    print(json.dumps({"ok": True, "steps": rep["steps"], "per_step": round(rep["per_step"], 2),
                      "sites": sites}))
    return 0


def cmd_ref_value(path, key):
    lines = [l for l in open(path, encoding="utf-8", errors="replace") if l.startswith("{")]
    value = json.loads(lines[-1]).get(key) if lines else None
    print(json.dumps(value))
    return 0 if value is not None else 1


def cmd_trace_kernels(path, steps, top=8):
    """What a Chrome trace of STEPS training steps (LibTorch's or torch.profiler's Kineto JSON)
    launched on the device, per step: kernels (category "kernel"), copies and fills
    ("gpu_memcpy", "gpu_memset"), their summed device time, and the TOP kernels by time (names cut
    to 90 characters). On a CPU-only trace those are 0 and cpu_ops_per_step (category "cpu_op",
    nested ops counted each) is the only count."""
    if not os.path.exists(path):
        print(json.dumps({"ok": False, "why": f"no {path}"}))
        return 1
    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    by_cat = {}
    for e in events:
        if e.get("ph") == "X":
            by_cat.setdefault(e.get("cat", ""), []).append(e)
    kernels = by_cat.get("kernel", [])
    per_name = {}
    for e in kernels:
        t = per_name.setdefault(e["name"], [0.0, 0])
        t[0] += float(e.get("dur", 0))
        t[1] += 1
    kernel_us = sum(t[0] for t in per_name.values())
    tops = sorted(per_name.items(), key=lambda kv: -kv[1][0])[:top]
    out = {
        "ok": True, "profiled_steps": steps,
        "kernels_per_step": round(len(kernels) / steps, 1),
        "copies_per_step": round(
            (len(by_cat.get("gpu_memcpy", [])) + len(by_cat.get("gpu_memset", []))) / steps, 1),
        "kernel_ms_per_step": round(kernel_us / 1e3 / steps, 3),
        "cpu_ops_per_step": round(len(by_cat.get("cpu_op", [])) / steps, 1),
        "top_kernels": [{"name": n[:90], "ms_per_step": round(t[0] / 1e3 / steps, 3),
                         "calls_per_step": round(t[1] / steps, 1),
                         "share": round(t[0] / kernel_us, 3) if kernel_us else None}
                        for n, t in tops],
    }
    print(json.dumps(out))
    return 0


def cmd_bench_summary(out):
    """The bench check's rows of OUT/results.jsonl side by side: tokens/s, MFU and kernels per
    step of each way the shape ran, mllm's speed over each PyTorch one's, and the MFU target of
    the GPU throughput issue (0.40). Exit 1 when mllm's eager run or a PyTorch run is missing."""
    rows = {r["check"]: r for r in load_rows(os.path.join(out, "results.jsonl"))}
    ways = {"mllm_eager": "bench_mllm_eager", "mllm_graphs": "bench_mllm_graphs",
            "torch_eager": "bench_torch_eager", "torch_compile": "bench_torch_compile"}
    table = {}
    for way, check in ways.items():
        r = rows.get(check)
        if r and r["status"] != "fail" and r.get("tokens_per_s"):
            table[way] = {k: r.get(k)
                          for k in ("tokens_per_s", "mfu", "kernels_per_step", "peak_mib")}
    missing = [w for w in ("mllm_eager", "torch_eager", "torch_compile") if w not in table]
    if missing:
        print(json.dumps({"ok": False, "why": "no figures for " + ", ".join(missing)}))
        return 1
    best = max((w for w in ("mllm_eager", "mllm_graphs") if w in table),
               key=lambda w: table[w]["tokens_per_s"])
    ours = table[best]["tokens_per_s"]
    print(json.dumps({"ok": True, "ways": table, "mllm_best": best,
                      "vs_torch_eager": round(ours / table["torch_eager"]["tokens_per_s"], 3),
                      "vs_torch_compile": round(ours / table["torch_compile"]["tokens_per_s"], 3),
                      "mfu": table[best]["mfu"], "mfu_target": 0.40}))
    return 0


def parse_value(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def cell(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, str):
        return v
    return json.dumps(v, ensure_ascii=False)  # null, true, objects, lists


def write_report(out, device):
    rows = load_rows(os.path.join(out, "results.jsonl"))
    try:
        gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                             timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        gpu = ""
    report = {"device": device, "gpu": gpu or "no nvidia-smi", "checks": rows,
              "passed": bool(rows) and all(r["status"] in ("pass", "info", "skipped") for r in rows)}
    with open(os.path.join(out, "report.json.tmp"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    os.replace(os.path.join(out, "report.json.tmp"), os.path.join(out, "report.json"))
    lines = [f"# gpu-check ({gpu or device})", "",
             f"verdict: {'PASS' if report['passed'] else 'FAIL'}", "",
             "| check | status | figures |", "|---|---|---|"]
    for r in rows:
        figures = ", ".join(f"{k} {cell(v)}" for k, v in r.items()
                            if k not in ("check", "status", "sync_sites", "top_kernels", "ways"))
        lines.append(f"| {r['check']} | {r['status']} | {figures} |")
    for r in rows:
        if r.get("sync_sites"):
            lines += ["", f"## Host synchronisations per step ({r['check']})", "",
                      "| per step | phase | LibTorch op | from |", "|---|---|---|---|"]
            for s in r["sync_sites"]:
                lines.append(f"| {s['per_step']} | {s['phase']} | `{s['op']}` | `{s['from']}` |")
    for r in rows:
        if r.get("ways"):
            lines += ["", f"## The bench shape, side by side ({r['check']})", "",
                      "| run | tokens/s | MFU | kernels / step | peak MiB |", "|---|---|---|---|---|"]
            for way, w in r["ways"].items():
                lines.append(f"| {way} | {cell(w['tokens_per_s'])} | {cell(w['mfu'])} | "
                             f"{cell(w['kernels_per_step'])} | {cell(w['peak_mib'])} |")
    for r in rows:
        if r.get("top_kernels"):
            lines += ["", f"## Top kernels by time ({r['check']})", "",
                      "| ms / step | calls / step | share | kernel |", "|---|---|---|---|"]
            for k in r["top_kernels"]:
                lines.append(f"| {cell(k['ms_per_step'])} | {cell(k['calls_per_step'])} | "
                             f"{cell(k['share'])} | `{k['name']}` |")
    with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return report


def cmd_record(out, check, status, fields):
    if status not in ("pass", "fail", "info", "skipped"):
        sys.exit(f"gpu_check_report.py: status must be pass, fail, info or skipped, not {status!r}")
    row = {"check": check, "status": status}
    for f in fields:
        key, sep, value = f.partition("=")
        if not sep:
            sys.exit(f"gpu_check_report.py: expected KEY=JSON, got {f!r}")
        value = parse_value(value)
        # A whole JSON object given as `_=...` is merged into the row.
        if key == "_" and isinstance(value, dict):
            row.update(value)
        else:
            row[key] = value
    with open(os.path.join(out, "results.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    write_report(out, os.environ.get("MLLM_GPU_CHECK_DEVICE", "cuda"))
    print(f"gpu-check: {check}: {status} " + ", ".join(
        f"{k} {cell(v)}" for k, v in row.items()
        if k not in ("check", "status", "sync_sites", "top_kernels", "ways")),
        flush=True)
    return 0


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    cmd, args = argv[1], argv[2:]
    if cmd == "record" and len(args) >= 3:
        return cmd_record(args[0], args[1], args[2], args[3:])
    if cmd == "metrics" and len(args) == 1:
        return cmd_metrics(args[0])
    if cmd == "compare" and len(args) in (3, 5):
        steps = int(args[4]) if len(args) == 5 and args[3] == "--steps" else None
        return cmd_compare(args[0], args[1], float(args[2]), steps)
    if cmd == "backend" and len(args) == 2:
        return cmd_backend(args[0], args[1])
    if cmd == "sync-debug" and len(args) == 1:
        return cmd_sync_debug(args[0])
    if cmd == "ref-value" and len(args) == 2:
        return cmd_ref_value(args[0], args[1])
    if cmd == "bench-summary" and len(args) == 1:
        return cmd_bench_summary(args[0])
    if cmd == "trace-kernels" and len(args) in (2, 3):
        return cmd_trace_kernels(args[0], int(args[1]), *(int(a) for a in args[2:]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
