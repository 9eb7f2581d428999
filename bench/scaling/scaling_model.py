#!/usr/bin/env python3
"""The scaling model of docs/scaling.md (standard library + gnuplot; run by bench/scaling/run.sh).

1. Fits the latency-bandwidth (alpha-beta) model of our mpi backend's all-reduce to
   bench/scaling/data/allreduce.csv (measured here by measure.sh) and checks it on held-out
   points: world sizes (fit on even np, test on odd np) and message sizes (fit on 4 KiB x 4^k,
   test on the sizes in between).
2. Checks the step-time model on this machine: mini's measured single-rank compute plus the
   fitted all-reduce against mllm-train's measured step time at np = 2, 4, 8 (data/mini_np*.jsonl).
3. Predicts step time, exposed communication and scaling efficiency on H200 GPUs (NCCL; published
   figures from bench/scaling/published.json) for recipes/mini.yaml, GPT-2 small and a 1.1B
   llama (TinyLlama's shape) at 8, 64 and 1,024 GPUs, over per-GPU batch and bucket size.
4. Writes docs/scaling.md and docs/scaling.png.

   scaling_model.py [--data DIR] [--published FILE] [--doc FILE] [--png FILE] [--gnuplot PROG]
"""
import argparse
import csv
import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
# Buffers up to this many bytes take the all-gather path (framework/mllm/distributed/
# mpi_communicator.h, detail::kAllGatherPathMaxBytes); larger ones alltoallv + allgatherv.
SMALL_PATH_MAX = 64 * KiB


# ----------------------------------------------------------------------------------------------
# Least squares (no numpy: a handful of unknowns)

def solve(a, b):
    """Solves the square system a x = b by Gaussian elimination with partial pivoting."""
    n = len(b)
    m = [list(row) + [rhs] for row, rhs in zip(a, b)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[piv][c]) < 1e-300:
            raise ValueError("singular system")
        m[c], m[piv] = m[piv], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def nnls(rows, y):
    """Non-negative least squares for a few columns: the best unconstrained solution over every
    subset of columns whose coefficients all come out >= 0 (columns outside the subset are 0).
    Columns are scaled to unit norm first (they span many orders of magnitude)."""
    k = len(rows[0])
    scale = [math.sqrt(sum(r[j] ** 2 for r in rows)) or 1.0 for j in range(k)]
    xs = [[r[j] / scale[j] for j in range(k)] for r in rows]
    best = None
    for size in range(k, 0, -1):
        for cols in itertools.combinations(range(k), size):
            ata = [[sum(r[i] * r[j] for r in xs) for j in cols] for i in cols]
            aty = [sum(r[i] * t for r, t in zip(xs, y)) for i in cols]
            try:
                sol = solve(ata, aty)
            except ValueError:
                continue
            if min(sol) < 0:
                continue
            coef = [0.0] * k
            for c, v in zip(cols, sol):
                coef[c] = v
            sse = sum((sum(r[j] * coef[j] for j in range(k)) - t) ** 2 for r, t in zip(xs, y))
            if best is None or sse < best[0] - 1e-15:
                best = (sse, coef)
    return [c / s for c, s in zip(best[1], scale)]


# ----------------------------------------------------------------------------------------------
# CPU: our mpi backend's all-reduce

def load_allreduce(path):
    """{(np, bytes): [seconds per call, one per repetition]} of impl mllm."""
    reps = {}
    with open(path, encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["impl"] != "mllm":
                continue
            reps.setdefault((int(row["np"]), int(row["bytes"])), []).append(float(row["seconds"]))
    if not reps:
        raise SystemExit(f"scaling_model: {path}: no mllm rows (run bench/scaling/measure.sh)")
    return reps


# Time-sharing factor of p ranks on C cores. "ring": none (each rank has its own core, the
# algorithm's own cost). "p/C": the cores are shared perfectly. "ceil(p/C)": the collective waits
# for the most loaded core, which holds ceil(p/C) ranks.
SHARES = {
    "ring": lambda p, c: 1.0,
    "ring x max(1, p/C)": lambda p, c: max(1.0, p / c),
    "ring x ceil(p/C)": lambda p, c: float(math.ceil(p / c)),
}


def regime(n):
    return "small" if n <= SMALL_PATH_MAX else "large"


def features(share, n, p, cores):
    """Columns of the linear model, times the time-sharing factor.
    large (alltoallv of 1/p slices, local reduction, allgatherv): T = t0 + 2(p-1) alpha
        + 2 (p-1)/p n beta, where beta also carries the reduction (each rank sums (p-1)/p n
        elements from p rows): 2 (p-1)/p n beta = (p-1)/p n (2 beta_copy + gamma).
    small (allgather of the whole buffer, local reduction of p rows):
        T = t0 + (p-1) alpha + (p-1) n beta."""
    s = SHARES[share](p, cores)
    if regime(n) == "large":
        return [s, s * 2 * (p - 1), s * 2 * (p - 1) / p * n]
    return [s, s * (p - 1), s * (p - 1) * n]


def fit(share, points, cores):
    """points [(n, p, seconds)] -> {"small": coef, "large": coef} minimising relative error."""
    out = {}
    for reg in ("small", "large"):
        pts = [q for q in points if regime(q[0]) == reg]
        rows = [[x / t for x in features(share, n, p, cores)] for n, p, t in pts]
        out[reg] = nnls(rows, [1.0] * len(pts))
    return out


def predict(share, coef, n, p, cores):
    return sum(a * b for a, b in zip(features(share, n, p, cores), coef[regime(n)]))


def rel_errors(share, coef, points, cores):
    return [(predict(share, coef, n, p, cores) - t) / t for n, p, t in points]


def summary(errs):
    a = sorted(abs(e) for e in errs)
    return {"median": statistics.median(a), "mean": statistics.fmean(a), "p90": a[min(len(a) - 1, int(0.9 * len(a)))],
            "max": a[-1], "rms": math.sqrt(sum(e * e for e in errs) / len(errs)), "n": len(errs)}


def cpu_fit(reps, cores):
    med = {k: statistics.median(v) for k, v in reps.items()}
    points = [(n, p, t) for (p, n), t in sorted(med.items())]
    nps = sorted({p for _, p, _ in points})
    sizes = sorted({n for n, _, _ in points})
    splits = {
        "A": ("fit on even np, test on odd np",
              lambda n, p: p % 2 == 0),
        "B": ("fit on 4 KiB x 4^k, test on the sizes in between",
              lambda n, p: round(math.log(n / (4 * KiB), 4), 9) == int(round(math.log(n / (4 * KiB), 4)))),
    }
    results = {}
    for share in SHARES:
        results[share] = {}
        for key, (_, is_train) in splits.items():
            train = [q for q in points if is_train(q[0], q[1])]
            test = [q for q in points if not is_train(q[0], q[1])]
            coef = fit(share, train, cores)
            results[share][key] = {"coef": coef, "train": summary(rel_errors(share, coef, train, cores)),
                                   "test": summary(rel_errors(share, coef, test, cores)),
                                   "test_points": [(n, p, t, predict(share, coef, n, p, cores)) for n, p, t in test]}
    # The variant whose mean held-out error over world sizes (split A) is lowest; on even np the
    # two time-sharing variants are the same model, so odd np decide between them.
    chosen = min(SHARES, key=lambda s: results[s]["A"]["test"]["mean"])
    final = fit(chosen, points, cores)
    spread = statistics.median((max(v) - min(v)) / statistics.median(v) for v in reps.values())
    return {"points": points, "nps": nps, "sizes": sizes, "results": results, "splits": splits,
            "chosen": chosen, "final": final, "cores": cores, "rep_spread": spread,
            "n_reps": statistics.median(len(v) for v in reps.values()),
            "final_err": summary(rel_errors(chosen, final, points, cores))}


# ----------------------------------------------------------------------------------------------
# Model shapes: parameter tensors in registration order (DataParallel buckets them in reverse),
# each with the backward FLOPs per token that precede its gradient being complete.

class Shape:
    def __init__(self, key, title, source, vocab, seq, d, layers, tensors, backward_ops, matmul_params,
                 attn_flops_per_token, ref_global_seqs, ref_note, micro_max):
        self.key, self.title, self.source = key, title, source
        self.vocab, self.seq, self.d, self.layers = vocab, seq, d, layers
        self.tensors = tensors              # [(name, numel)] registration order
        self.backward_ops = backward_ops    # [(flops_per_token, [names ready after it])] backward order
        self.params = sum(n for _, n in tensors)
        # FLOPs per token, forward + backward: mllm's convention (Model::flops_per_token):
        # 6 x (parameters that multiply activations) + 12 x layers x d_model x seq (attention).
        self.flops_per_token = 6 * matmul_params + attn_flops_per_token
        self.ref_global_seqs, self.ref_note, self.micro_max = ref_global_seqs, ref_note, micro_max


def linear(prefix, fan_in, fan_out, bias=True):
    t = [(prefix + ".weight", fan_in * fan_out)]
    if bias:
        t.append((prefix + ".bias", fan_out))
    return t


def minillm_shape(vocab, seq, d, layers, d_ff):
    """framework/mllm/model/minillm.h: learned positions, post-LN, ReLU FFN, biases, untied head."""
    tensors = [("tok_emb.weight", vocab * d), ("pos_emb.weight", seq * d)]
    ops = []
    for i in range(layers):
        p = f"layers.{i}."
        blk = []
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            blk += linear(p + "attn." + proj, d, d)
        blk += linear(p + "ffn.fc1", d, d_ff) + linear(p + "ffn.fc2", d_ff, d)
        blk += [(p + "norm1.weight", d), (p + "norm1.bias", d), (p + "norm2.weight", d), (p + "norm2.bias", d)]
        tensors += blk
    tensors += linear("lm_head", d, vocab)
    size = dict(tensors)
    ops.append((4 * size["lm_head.weight"] + 4 * size["lm_head.bias"], ["lm_head.weight", "lm_head.bias"]))
    for i in reversed(range(layers)):
        p = f"layers.{i}."
        # post-LN block backward: norm2, fc2, fc1, norm1, o_proj, attention core, q/k/v
        for names in ([p + "norm2.weight", p + "norm2.bias"], [p + "ffn.fc2.weight", p + "ffn.fc2.bias"],
                      [p + "ffn.fc1.weight", p + "ffn.fc1.bias"], [p + "norm1.weight", p + "norm1.bias"],
                      [p + "attn.o_proj.weight", p + "attn.o_proj.bias"]):
            ops.append((4 * sum(size[n] for n in names), names))
        ops.append((8 * d * seq, []))
        names = [p + f"attn.{x}_proj.{w}" for x in "qkv" for w in ("weight", "bias")]
        ops.append((4 * sum(size[n] for n in names), names))
    ops.append((0, ["pos_emb.weight", "tok_emb.weight"]))
    params = sum(size.values())
    matmul = params - vocab * d - seq * d
    return tensors, ops, matmul, 12 * layers * d * seq


def gpt2_shape(vocab, seq, d, layers):
    """GPT-2 (Hugging Face GPT2LMHeadModel): learned positions, pre-LN, GELU MLP 4d, biases, head
    tied to wte: wte's gradient is complete only at the end of backward (it is also the input
    embedding)."""
    tensors = [("wte", vocab * d), ("wpe", seq * d)]
    for i in range(layers):
        p = f"h.{i}."
        tensors += [(p + "ln_1.weight", d), (p + "ln_1.bias", d)]
        tensors += linear(p + "attn.c_attn", d, 3 * d) + linear(p + "attn.c_proj", d, d)
        tensors += [(p + "ln_2.weight", d), (p + "ln_2.bias", d)]
        tensors += linear(p + "mlp.c_fc", d, 4 * d) + linear(p + "mlp.c_proj", 4 * d, d)
    tensors += [("ln_f.weight", d), ("ln_f.bias", d)]
    size = dict(tensors)
    ops = [(4 * vocab * d, []), (4 * 2 * d, ["ln_f.weight", "ln_f.bias"])]
    for i in reversed(range(layers)):
        p = f"h.{i}."
        for names in ([p + "mlp.c_proj.weight", p + "mlp.c_proj.bias"], [p + "mlp.c_fc.weight", p + "mlp.c_fc.bias"],
                      [p + "ln_2.weight", p + "ln_2.bias"], [p + "attn.c_proj.weight", p + "attn.c_proj.bias"]):
            ops.append((4 * sum(size[n] for n in names), names))
        ops.append((8 * d * seq, []))
        for names in ([p + "attn.c_attn.weight", p + "attn.c_attn.bias"], [p + "ln_1.weight", p + "ln_1.bias"]):
            ops.append((4 * sum(size[n] for n in names), names))
    ops.append((0, ["wpe", "wte"]))
    params = sum(size.values())
    matmul = params - seq * d  # the tied table multiplies activations in the head
    return tensors, ops, matmul, 12 * layers * d * seq


def llama_shape(vocab, seq, d, layers, heads, kv_heads, d_ff, tied):
    """framework/mllm/model/llama.h: RMSNorm pre-norm, RoPE, GQA, SwiGLU, no biases."""
    kv = d // heads * kv_heads
    tensors = [("tok_emb.weight", vocab * d)]
    for i in range(layers):
        p = f"layers.{i}."
        tensors += [(p + "attn_norm.weight", d)]
        tensors += linear(p + "attn.q_proj", d, d, False) + linear(p + "attn.k_proj", d, kv, False)
        tensors += linear(p + "attn.v_proj", d, kv, False) + linear(p + "attn.o_proj", d, d, False)
        tensors += [(p + "ffn_norm.weight", d)]
        tensors += linear(p + "ffn.gate_proj", d, d_ff, False) + linear(p + "ffn.up_proj", d, d_ff, False)
        tensors += linear(p + "ffn.down_proj", d_ff, d, False)
    tensors += [("norm.weight", d)]
    if not tied:
        tensors += linear("lm_head", d, vocab, False)
    size = dict(tensors)
    ops = [(4 * vocab * d, [] if tied else ["lm_head.weight"]), (4 * d, ["norm.weight"])]
    for i in reversed(range(layers)):
        p = f"layers.{i}."
        for names in ([p + "ffn.down_proj.weight"], [p + "ffn.gate_proj.weight", p + "ffn.up_proj.weight"],
                      [p + "ffn_norm.weight"], [p + "attn.o_proj.weight"]):
            ops.append((4 * sum(size[n] for n in names), names))
        ops.append((8 * d * seq, []))
        for names in ([p + f"attn.{x}_proj.weight" for x in "qkv"], [p + "attn_norm.weight"]):
            ops.append((4 * sum(size[n] for n in names), names))
    ops.append((0, ["tok_emb.weight"]))
    params = sum(size.values())
    matmul = params - vocab * d + (vocab * d if tied else 0)
    return tensors, ops, matmul, 12 * layers * d * seq


def shapes(mini_vocab):
    out = []
    t, o, m, a = minillm_shape(mini_vocab, 64, 128, 2, 256)
    out.append(Shape("mini", "recipes/mini.yaml (minillm d128, 2 layers, seq 64, char vocab %d)" % mini_vocab,
                     "recipes/mini.yaml, configs/model/minillm-tiny.yaml; mllm-train logs 2,764,510 parameters",
                     mini_vocab, 64, 128, 2, t, o, m, a, 64, "the recipe's global batch: 64 x 64 tokens", 64))
    t, o, m, a = gpt2_shape(50257, 1024, 768, 12)
    out.append(Shape("gpt2", "GPT-2 small (124M: d768, 12 layers, 12 heads, seq 1024, vocab 50257, tied head)",
                     "gpt2", 50257, 1024, 768, 12, t, o, m, a, 512,
                     "0.5M tokens (512 x 1024), GPT-3's batch for its 125M model", 16))
    t, o, m, a = llama_shape(32000, 2048, 2048, 22, 32, 4, 5632, False)
    out.append(Shape("llama1b", "1.1B llama (TinyLlama: d2048, 22 layers, 32 heads, 4 KV heads, SwiGLU 5632, vocab 32000, seq 2048, untied)",
                     "tinyllama", 32000, 2048, 2048, 22, t, o, m, a, 1024,
                     "2M tokens (1024 x 2048), TinyLlama's batch", 8))
    return out


def plan_buckets(tensors, cap_bytes, elem=4):
    """framework/mllm/distributed/bucket_plan.cpp: reverse registration order, a tensor joins the
    open bucket unless that takes it past the cap (then the bucket is closed first); a larger
    tensor gets a bucket of its own. DataParallel adds one float per parameter (its 'used' flag)."""
    buckets, cur, cur_bytes = [], [], 0
    for name, numel in reversed(tensors):
        b = numel * elem
        if cur and cur_bytes + b > cap_bytes:
            buckets.append(cur)
            cur, cur_bytes = [], 0
        cur.append((name, numel))
        cur_bytes += b
    if cur:
        buckets.append(cur)
    return [(sum(n for _, n in bk) + len(bk)) * elem for bk in buckets], [[n for n, _ in bk] for bk in buckets]


def ready_fractions(shape):
    """{tensor: fraction of the backward pass done when its gradient is complete}."""
    total = sum(f for f, _ in shape.backward_ops)
    done, out = 0.0, {}
    for f, names in shape.backward_ops:
        done += f
        for n in names:
            out[n] = done / total
    missing = {n for n, _ in shape.tensors} - set(out)
    assert not missing, missing
    return out


# ----------------------------------------------------------------------------------------------
# GPU: NCCL all-reduce time from published figures

class Nccl:
    """All-reduce on H200 GPUs over NCCL. One node (NVSwitch): alpha + 2(p-1)/p n / busbw fitted
    to Azure's published 8x H200 curve (1 MiB..8 GiB). Several nodes: NCCL's own latency model
    (tuning.cc) for ring, tree and NVLSTree, and the bus bandwidth of 8 x 400 Gb/s NICs at the
    efficiency measured on 4 H200 nodes; the fastest algorithm per message, as NCCL's tuner picks."""

    def __init__(self, pub):
        c = pub["constants"]
        self.g = c["gpus_per_node"]
        self.nic = c["nic_gbps_each"] * 1e9
        self.net_eff = c["net_busbw_gbs_h200_4node"] / (self.g * c["nic_gbps_each"])
        self.net_busbw = self.g * self.nic * self.net_eff
        self.k = c["nccl"]
        cur = pub["curves"]["azure_h200_nccl"]
        p = cur["ranks"]
        pts = [(1 << lb, 2 * (p - 1) / p * (1 << lb) / (bw * 1e9))
               for lb, bw in zip(cur["log2_bytes"], cur["busbw"]) if (1 << lb) >= MiB]
        a, b = nnls([[1 / t, 2 * (p - 1) / p * n / t] for n, t in pts], [1.0] * len(pts))
        self.alpha1, self.nvl_busbw = a, 1 / b

    def latency(self, algo, p):
        k, g, c = max(1, p // self.g), self.g, self.k
        if k == 1:
            return self.alpha1
        if algo == "ring":
            hop = max(c["ring_nvlink_hop_us"], 3 * c["net_overhead_us"])
            inter = 2 * (k - 1)
            return c["ring_plateau_factor_hopper"] * (c["ring_base_us"] + (2 * (p - 1) - inter) * hop
                                                       + inter * c["ring_net_hop_us"]) * 1e-6
        if algo == "tree":
            return (c["tree_base_us"] + 2 * ((g - 1) * c["tree_nvlink_hop_us"] + math.log2(k) * c["tree_net_hop_us"])) * 1e-6
        if algo == "nvlstree":
            return (c["nvlstree_nvlink_us"] + 2 * math.log2(k) * c["nvlstree_net_hop_us"]) * 1e-6
        raise ValueError(algo)

    def busbw(self, algo, p, n):
        if p <= self.g:
            return self.nvl_busbw
        if algo == "tree":
            corr = self.k["tree_simple_correction_by_log2_bytes_over_64"]
            i = int(math.log2(max(1, int(n) >> 6)))
            return self.net_busbw * self.k["tree_bw_factor"] * (corr[i] if i < len(corr) else 1.0)
        return self.net_busbw

    def time(self, n, p, algos=("ring", "tree", "nvlstree"), with_algo=False):
        """Seconds for an all-reduce of n bytes over p GPUs (g per node): NCCL's latency model plus
        2 (p-1)/p n / busbw, the fastest algorithm as NCCL's tuner picks it."""
        if p <= 1:
            return (0.0, "-") if with_algo else 0.0
        cands = ["nvls"] if p <= self.g else list(algos)
        best = min((self.latency(a, p) + 2 * (p - 1) / p * n / self.busbw(a, p, n), a) for a in cands)
        return best if with_algo else best[0]


def validate_gpu(pub, nccl):
    """Model vs the published curves (busbw at each size), over 1 MiB..16 GiB."""
    out = {}
    for key, cur in pub["curves"].items():
        p = cur["ranks"]
        rows = []
        for lb, bw in zip(cur["log2_bytes"], cur["busbw"]):
            n = 1 << lb
            if n < MiB:
                continue
            if cur["nodes"] == 1:
                t = nccl.time(n, p)
            else:
                # That system: B200 nodes, EFA (no NVLSTree), Ring chosen by AWS's tuner; its own
                # large-message plateau instead of H200's.
                plateau = cur["busbw"][-1] * 1e9
                t = nccl.latency("ring", p) + 2 * (p - 1) / p * n / plateau
            model_bw = 2 * (p - 1) / p * n / t / 1e9
            rows.append((n, bw, model_bw, (model_bw - bw) / bw))
        out[key] = rows
    return out


# ----------------------------------------------------------------------------------------------
# Step model: compute, bucket schedule, exposed communication

def step(shape, p, seqs_per_gpu, cap_bytes, comm_time, flops_per_s, micro_max=None):
    """One optimizer step on one rank: accum micro-steps of `micro` sequences; buckets are
    all-reduced, one at a time in bucket order, from when their last gradient is complete
    during the last micro-step's backward (and the previous bucket was launched)."""
    micro_max = micro_max or shape.micro_max
    micro = min(seqs_per_gpu, micro_max)
    accum = math.ceil(seqs_per_gpu / micro)
    t_micro = shape.flops_per_token * micro * shape.seq / flops_per_s
    t_bwd = t_micro * 2 / 3
    sizes, names = plan_buckets(shape.tensors, cap_bytes)
    ready = ready_fractions(shape)
    finish, launched, total_comm = 0.0, 0.0, 0.0
    for b, members in zip(sizes, names):
        t_ready = max(ready[n] for n in members) * t_bwd
        launched = max(launched, t_ready)
        dt = comm_time(b, p)
        total_comm += dt
        finish = max(finish, launched) + dt
    exposed = max(0.0, finish - t_bwd)
    t_compute = accum * t_micro
    return {"micro": micro, "accum": accum, "seqs": seqs_per_gpu, "t_compute": t_compute,
            "t_comm": total_comm, "exposed": exposed, "t_step": t_compute + exposed,
            "eff": t_compute / (t_compute + exposed), "eff_serial": t_compute / (t_compute + total_comm),
            "buckets": len(sizes)}


# ----------------------------------------------------------------------------------------------
# Measured step time of mini on this machine

def load_jsonl(path, skip=2):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    return rows[skip:]


def mini_check(data, cpu, mini):
    """Predicted vs measured step of recipes/mini.yaml at np ranks x 1 thread on this machine."""
    runs = {}
    for name in sorted(os.listdir(data)):
        m = re.fullmatch(r"mini_np(\d+)\.jsonl", name)
        if m:
            runs[int(m.group(1))] = load_jsonl(os.path.join(data, name))
    if 1 not in runs:
        return None
    med = lambda rows, k: statistics.median(r[k] for r in rows)
    base = runs[1]
    t_c1 = (med(base, "forward_ms") + med(base, "backward_ms") + med(base, "optimizer_ms")) / 1e3
    t_other = med(base, "step_ms") / 1e3 - t_c1
    share, coef, cores = cpu["chosen"], cpu["final"], cpu["cores"]
    grad_bytes = (mini.params + len(mini.tensors)) * 4   # one 25 MiB bucket, float32 + flags
    out = []
    for p in sorted(runs):
        if p == 1:
            continue
        rows = runs[p]
        compute = t_c1 / p * math.ceil(p / cores)  # p ranks time-share the cores
        ar = predict(share, coef, grad_bytes, p, cores)
        small = predict(share, coef, 8, p, cores) + predict(share, coef, 24, p, cores)
        pred = compute + ar + small + t_other
        out.append({"np": p, "compute_pred": compute, "compute_meas": (med(rows, "forward_ms") + med(rows, "backward_ms") + med(rows, "optimizer_ms")) / 1e3,
                    "ar_pred": ar, "comm_meas": med(rows, "comm_ms") / 1e3, "small_pred": small,
                    "step_pred": pred, "step_meas": med(rows, "step_ms") / 1e3,
                    "err": (pred - med(rows, "step_ms") / 1e3) / (med(rows, "step_ms") / 1e3)})
    return {"t_c1": t_c1, "t_other": t_other, "step1": med(base, "step_ms") / 1e3, "grad_bytes": grad_bytes,
            "rows": out, "steps": len(base)}


def parse_overlap(path):
    if not os.path.exists(path):
        return None
    text = open(path, encoding="utf-8").read()
    num = lambda pat: float(re.search(pat, text).group(1))
    return {"t_bwd": num(r"T_bwd\s+([-\d.]+) ms"), "t_comm": num(r"T_comm\s+([-\d.]+) ms"),
            "t_total": num(r"T_total\s+([-\d.]+) ms"), "hidden": num(r"hidden\s+([-\d.]+) %") / 100,
            "concurrent": num(r"([-\d.]+) %\s+of T_comm ran concurrently") / 100,
            "slowdown": num(r"([-\d.]+) ms\s+backward slowdown"),
            "buckets": int(re.search(r"(\d+) buckets", text).group(1))}


# ----------------------------------------------------------------------------------------------
# Formatting helpers

def fmt_bytes(n):
    for unit, v in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= v:
            x = n / v
            return f"{x:.0f} {unit}" if abs(x - round(x)) < 1e-9 else f"{x:.1f} {unit}"
    return f"{n} B"


def fmt_t(s):
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms" if s < 0.1 else f"{s * 1e3:.0f} ms"
    return f"{s * 1e6:.0f} µs"


def fmt_tokens(t):
    if t >= 1e6:
        return f"{t / 1e6:.2g}M" if t < 1e7 else f"{t / 1e6:.0f}M"
    if t >= 1e3:
        return f"{t / 1e3:.3g}k"
    return str(int(t))


def n_half(nccl, p):
    """Bytes at which an all-reduce over p GPUs takes twice its zero-byte latency (bisection)."""
    t0 = nccl.time(1, p)
    lo, hi = 1.0, 64.0 * GiB
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if nccl.time(mid, p) < 2 * t0 else (lo, mid)
    return hi


def fmt_bytes_dec(n):
    return f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def pct(x):
    # One decimal near the 90% threshold, so that a rounded "90%" never hides 89.6%.
    return f"{100 * x:.1f}%" if 0.895 <= x < 0.905 else f"{100 * x:.0f}%"


def gp_str(text):
    return "'" + text.replace("'", "''") + "'"


# ----------------------------------------------------------------------------------------------
# Sweeps

P_TABLE = [8, 64, 1024]
P_CURVE = [8 << k for k in range(11)]           # 8 .. 8192
CAPS_MIB = [1, 4, 25, 100, 400, 1600]
SEQS = [1 << k for k in range(10)]               # 1 .. 512 sequences per GPU per step
MFU = 0.40
TARGET = 0.90


class Gpu:
    def __init__(self, pub, nccl, mfu=MFU):
        self.nccl, self.mfu = nccl, mfu
        self.flops = pub["constants"]["peak_bf16_dense_tflops"] * 1e12 * mfu

    def run(self, shape, p, seqs, cap_mib):
        return step(shape, p, seqs, cap_mib * MiB, self.nccl.time, self.flops)

    def best(self, shape, p, seqs, key="eff"):
        """(efficiency, bucket cap in MiB) of the best cap (the smaller one on a tie)."""
        return max(((self.run(shape, p, seqs, c)[key], c) for c in CAPS_MIB), key=lambda x: (round(x[0], 6), -x[1]))

    def min_batch(self, shape, p, key="eff", target=TARGET):
        """Smallest sequences per GPU (power of 2) reaching `target` with the best bucket size:
        (seqs, best cap, [caps reaching target]) or None."""
        for s in SEQS:
            effs = {c: self.run(shape, p, s, c)[key] for c in CAPS_MIB}
            ok = [c for c in CAPS_MIB if effs[c] >= target]
            if ok:
                return s, max(effs, key=effs.get), ok, effs
        return None


def analyse(pub, shapes_, nccl):
    gpu = Gpu(pub, nccl)
    head = []
    for sh in shapes_:
        for p in P_TABLE:
            seqs = sh.ref_global_seqs / p
            fits = seqs >= 1
            s = int(seqs) if fits else 1
            r25 = gpu.run(sh, p, s, 25)
            effb, capb = gpu.best(sh, p, s)
            rb = gpu.run(sh, p, s, capb)
            head.append({"shape": sh, "p": p, "seqs": s, "fits": fits, "r25": r25, "rb": rb, "capb": capb})
    minb = {}
    for sh in shapes_:
        for p in P_CURVE:
            minb[(sh.key, p)] = (gpu.min_batch(sh, p), gpu.min_batch(sh, p, key="eff_serial"))
    sens = {}
    for mfu in (0.30, 0.40, 0.55):
        g = Gpu(pub, nccl, mfu)
        for sh in shapes_:
            for p in P_TABLE:
                sens[(mfu, sh.key, p)] = g.min_batch(sh, p)
    return gpu, head, minb, sens


# ----------------------------------------------------------------------------------------------
# Figure

def plot(path, gnuplot, cpu, pub, nccl, shapes_, gpu):
    work = tempfile.mkdtemp(prefix="mllm-scaling-plot.")
    blocks = []

    def block(rows):
        blocks.append(rows)
        return len(blocks) - 1

    share, coef, cores = cpu["chosen"], cpu["final"], cpu["cores"]
    cpu_idx = []
    for p in cpu["nps"]:
        meas = [(n, t * 1e6) for n, q, t in cpu["points"] if q == p]
        model = []
        for n in cpu["sizes"]:
            model.append((n, predict(share, coef, n, p, cores) * 1e6))
        cpu_idx.append((p, block(meas), block(model)))
    pub_idx = []
    for key, label in (("azure_h200_nccl", "8x H200, Azure (fitted)"), ("mleng_h200_1node", "8x H200, ml-engineering (held out)"),
                       ("mleng_b200_4node", "4x8 B200, ml-engineering (check)")):
        cur = pub["curves"][key]
        pub_idx.append((label, block([(1 << lb, bw) for lb, bw in zip(cur["log2_bytes"], cur["busbw"])])))
    model_idx = []
    sizes = [1 << lb for lb in range(16, 35)]
    model_idx.append(("model, 8 GPUs", block([(n, 2 * 7 / 8 * n / nccl.time(n, 8) / 1e9) for n in sizes])))
    b200 = pub["curves"]["mleng_b200_4node"]["busbw"][-1] * 1e9
    model_idx.append(("model, 32 ranks ring (B200 plateau)", block(
        [(n, 2 * 31 / 32 * n / (nccl.latency("ring", 32) + 2 * 31 / 32 * n / b200) / 1e9) for n in sizes])))
    for p in (64, 1024):
        model_idx.append((f"model, {p} GPUs", block([(n, 2 * (p - 1) / p * n / nccl.time(n, p) / 1e9) for n in sizes])))
    eff_idx = []
    for sh in shapes_:
        for cap in ("best", 25):
            rows = []
            for p in P_CURVE:
                if cap == "best":
                    e, _ = gpu.best(sh, p, 1)
                else:
                    e = gpu.run(sh, p, 1, 25)["eff"]
                rows.append((p, 100 * e))
            eff_idx.append((sh.key, cap, block(rows)))
    bucket_idx = []
    for sh in shapes_[1:]:
        for seqs in (1, 2):
            bucket_idx.append((sh.key, seqs, block([(c, 100 * gpu.run(sh, 1024, seqs, c)["eff"]) for c in CAPS_MIB])))
    with open(os.path.join(work, "d.dat"), "w", encoding="utf-8") as f:
        for rows in blocks:
            for row in rows or [("nan", "nan")]:
                f.write(" ".join(repr(x) if isinstance(x, float) else str(x) for x in row) + "\n")
            f.write("\n\n")
    names = {"mini": "mini", "gpt2": "GPT-2 small", "llama1b": "1.1B llama"}
    gp = [f"set terminal pngcairo size 1500,1100 font 'Sans,10'", f"set output {gp_str(os.path.abspath(path))}",
          "set multiplot layout 2,2", "set grid", "set key top left font ',9'", "set logscale x 2",
          "set format x '%.0b%B'",
          "set title 'This VM: our mpi all-reduce, measured (points) and fitted (lines)'",
          "set xlabel 'message bytes'", "set ylabel 'time per all-reduce (us)'", "set logscale y 10"]
    curves = []
    for i, (p, m, f) in enumerate(cpu_idx):
        c = i + 1
        curves.append(f"'d.dat' index {m} using 1:2 with points pt 7 ps 0.6 lc {c} title 'np={p}'")
        curves.append(f"'d.dat' index {f} using 1:2 with lines lw 1.5 lc {c} notitle")
    gp.append("plot " + ", ".join(curves))
    gp += ["unset logscale y", "set title 'GPUs: NCCL all-reduce bus bandwidth, published (points) and model (lines)'",
           "set ylabel 'busbw (GB/s)'", "set key top left"]
    curves = []
    for i, (label, b) in enumerate(pub_idx):
        curves.append(f"'d.dat' index {b} using 1:2 with points pt {5 + 2 * i} ps 0.8 lc {i + 1} title {gp_str(label)}")
    for i, (label, b) in enumerate(model_idx):
        curves.append(f"'d.dat' index {b} using 1:2 with lines lw 2 lc {[1, 3, 5, 6][i]} dt {[1, 1, 2, 4][i]} title {gp_str(label)}")
    gp.append("plot " + ", ".join(curves))
    gp += ["set format x '%g'", "set title 'H200 model: scaling efficiency at 1 sequence per GPU (solid: best bucket, dashed: 25 MiB)'",
           "set xlabel 'GPUs (8 per node)'", "set ylabel 'efficiency = compute / step (%)'", "set yrange [0:105]",
           "set key bottom left"]
    curves = []
    colors = {"mini": 4, "gpt2": 2, "llama1b": 1}
    for key, cap, b in eff_idx:
        dt = 1 if cap == "best" else 2
        title = gp_str(names[key]) if cap == "best" else "notitle"
        curves.append(f"'d.dat' index {b} using 1:2 with linespoints lw 2 pt 7 ps 0.6 dt {dt} lc {colors[key]} "
                      + (f"title {title}" if cap == "best" else "notitle"))
    curves.append("90 with lines lw 1.5 lc 'black' dt 2 title '90%'")
    gp.append("plot " + ", ".join(curves))
    gp += ["set title 'H200 model, 1,024 GPUs: efficiency against bucket size'", "set xlabel 'bucket cap (MiB)'",
           "set key bottom right"]
    curves = []
    for key, seqs, b in bucket_idx:
        curves.append(f"'d.dat' index {b} using 1:2 with linespoints lw 2 pt 7 dt {1 if seqs == 1 else 2} lc {colors[key]} "
                      f"title {gp_str(f'{names[key]}, {seqs} seq/GPU')}")
    curves.append("90 with lines lw 1.5 lc 'black' dt 2 title '90%'")
    gp.append("plot " + ", ".join(curves))
    gp.append("unset multiplot")
    with open(os.path.join(work, "plot.gp"), "w", encoding="utf-8") as f:
        f.write("\n".join(gp) + "\n")
    try:
        subprocess.run([gnuplot, "plot.gp"], cwd=work, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"scaling_model: gnuplot failed ({e}); the script is in {work}")
    for name in ("d.dat", "plot.gp"):
        os.remove(os.path.join(work, name))
    os.rmdir(work)


# ----------------------------------------------------------------------------------------------
# The document

NAMES = {"mini": "mini", "gpt2": "GPT-2 small", "llama1b": "1.1B llama"}


def read_machine(data):
    out = {}
    path = os.path.join(data, "machine.txt")
    if os.path.exists(path):
        for line in open(path, encoding="utf-8"):
            if ":" in line:
                k, v = line.split(":", 1)
                out[k.strip()] = v.strip()
    return out


def write_doc(path, ctx):
    cpu, mc, ov, pub, nccl, shapes_ = ctx["cpu"], ctx["mini"], ctx["overlap"], ctx["pub"], ctx["nccl"], ctx["shapes"]
    gpu, head, minb, sens, val, mach = ctx["gpu"], ctx["head"], ctx["minb"], ctx["sens"], ctx["val"], ctx["machine"]
    src = pub["sources"]
    link = lambda key: f"[{src[key]['label']}]({src[key]['url']})"
    share, coef, cores = cpu["chosen"], cpu["final"], cpu["cores"]
    L = []
    w = L.append
    w("# Scaling model: all-reduce cost, step time and data-parallel efficiency")
    w("")
    w("<!-- Generated by bench/scaling/run.sh; edit bench/scaling/scaling_model.py, not this file. -->")
    w(f"Generated by `bench/scaling/run.sh` (measure on this machine, then fit and predict) or "
      f"`bench/scaling/run.sh --no-measure` (refit from the committed measurements in `bench/scaling/data/`). "
      f"Do not edit by hand: the text lives in `bench/scaling/scaling_model.py`, the published inputs in "
      f"`bench/scaling/published.json`. Measurements: {mach.get('date', '?')}, {mach.get('cpu', '?')} "
      f"({mach.get('cores', '?')} vCPUs, {mach.get('memory', '?')}), {mach.get('openmpi', '?')}, commit {mach.get('commit', '?')}; "
      f"{mach.get('quiet', mach.get('not quiet', 'machine load not recorded'))}.")
    w("")
    w("What is **measured** here (our mpi backend's all-reduce, the overlap bench, mini's step times on this "
      "VM), what comes from **published** figures (GPU peak, NCCL bandwidth and latency, batch sizes) and "
      "what is **assumed** (MFU, micro-batch caps, that published efficiencies carry over) is said at each "
      "step; §9 lists it all.")
    w("")
    w("![measured and modelled all-reduce; predicted efficiency](scaling.png)")
    w("")
    # ---- conclusions
    llama, gpt2, mini = shapes_[2], shapes_[1], shapes_[0]

    def minb_text(sh, p, serial=False):
        m = minb[(sh.key, p)][1 if serial else 0]
        if m is None:
            return None
        s, capb, ok, effs = m
        return s, capb, ok, effs

    w("## Conclusions")
    w("")
    a_best = cpu["results"][share]["A"]["test"]
    b_best = cpu["results"][share]["B"]["test"]
    w(f"- **Our all-reduce follows the ring alpha-beta model.** Fitted on this VM (§2): per-message "
      f"alpha = {coef['large'][1] * 1e6:.1f} µs, per-byte beta = {coef['large'][2] * 1e9:.3f} ns "
      f"(1/beta = {1 / coef['large'][2] / 1e9:.2f} GB/s per rank, reduction included), with the ranks' "
      f"time-sharing of the {cores} vCPUs as the factor `{share.split(' x ')[-1] if ' x ' in share else '1'}`. Held out: median "
      f"error {pct(a_best['median'])} (90th percentile {pct(a_best['p90'])}) on world sizes it was not fitted on, "
      f"{pct(b_best['median'])} ({pct(b_best['p90'])}) on message sizes it was not fitted on. Repetitions of the "
      f"same point differ by {pct(cpu['rep_spread'])} (median max-min spread), so the fit is about as good as "
      f"this shared VM allows.")
    if mc:
        errs = [abs(r["err"]) for r in mc["rows"]]
        w(f"- **Compute + fitted all-reduce predicts mllm-train's step** on this VM (mini, np = "
          f"{', '.join(str(r['np']) for r in mc['rows'])}) within {pct(max(errs))} (§3).")
    for sh in (llama, gpt2):
        parts = []
        for p in P_TABLE:
            m = minb_text(sh, p)
            if m is None:
                parts.append(f"{p:,} GPUs: not reached with up to {SEQS[-1]} sequences per GPU")
                continue
            s, capb, ok, effs = m
            tok = s * sh.seq * p
            caps = f"{ok[0]}–{ok[-1]} MiB" if len(ok) > 1 else f"{ok[0]} MiB"
            parts.append(f"{p:,} GPUs: ≥ {s} sequence{'s' if s > 1 else ''} per GPU (global batch ≥ {fmt_tokens(tok)} tokens), "
                         f"bucket caps reaching it {caps} (25 MiB: {pct(effs[25])})")
        w(f"- **{NAMES[sh.key]}, efficiency > 90%** on H200s at the assumed 40% MFU needs " + "; ".join(parts) + ".")
    w(f"- **mini does not scale on GPUs at all**: its step is {fmt_t(gpu.run(mini, 8, 8, 25)['t_compute'])} of "
      f"FLOPs per GPU at 8 GPUs (8 sequences each) against a {fmt_t(nccl.time(mini.params * 4, 8))} all-reduce of its "
      f"{mini.params * 4 / 1e6:.1f} MB of gradients, and its 64-sequence global batch cannot even be split over "
      f"more than 64 ranks. It is a CPU recipe" + (
          f"; on this VM (§3) its all-reduce is {pct(min(r['ar_pred'] / r['step_pred'] for r in mc['rows']))}–"
          f"{pct(max(r['ar_pred'] / r['step_pred'] for r in mc['rows']))} of the step at np 2–8." if mc else "."))
    # bucket size conclusion
    lat = {p: min(nccl.latency(a, p) for a in (("nvls",) if p <= 8 else ("ring", "tree", "nvlstree"))) for p in P_TABLE}
    half = {p: n_half(nccl, p) for p in P_TABLE}
    caps_ok = {}
    for sh in (gpt2, llama):
        for p in P_TABLE:
            m = minb[(sh.key, p)][0]
            caps_ok[(sh.key, p)] = (f"{m[2][0]}–{m[2][-1]}" if len(m[2]) > 1 else f"{m[2][0]}") if m else "none"
    w(f"- **Bucket size.** Each bucket pays one all-reduce latency: {fmt_t(lat[8])} in one node, "
      f"{fmt_t(lat[64])} at 64 GPUs and {fmt_t(lat[1024])} at 1,024 (NCCL's tree/NVLSTree; a ring would pay "
      f"{fmt_t(nccl.latency('ring', 1024))} at 1,024). Below n½, the size whose transfer takes as long as the "
      f"latency ({fmt_bytes_dec(half[8])}, {fmt_bytes_dec(half[64])} and {fmt_bytes_dec(half[1024])}), a bucket mostly "
      f"waits; a bucket that is a large part of the gradient starts late and is still in flight when backward ends. "
      f"Caps that keep > 90% at the smallest such batch (§6.2), MiB, at 8 / 64 / 1,024 GPUs: 1.1B llama "
      f"{caps_ok[('llama1b', 8)]} / {caps_ok[('llama1b', 64)]} / {caps_ok[('llama1b', 1024)]}; GPT-2 small "
      f"{caps_ok[('gpt2', 8)]} / {caps_ok[('gpt2', 64)]} / {caps_ok[('gpt2', 1024)]}. So mllm's default "
      f"`dist.bucket_mb: 25` (PyTorch DDP's) is right in one node and for GPT-2-sized models; for the 1.1B model "
      f"at 64 GPUs and more use ~100–400 MiB, growing with the world size as Megatron-LM's default does "
      f"({link('megatron_bucket')}: max(40M, 1M × DP size) parameters per bucket).")
    # DP limit
    mem = {sh.key: sh.params * 16 / 1e9 for sh in shapes_}
    limits = ctx["limits"]
    w(f"- **Where data parallelism alone stops.** Not memory, for these shapes: model states are 16 bytes per "
      f"parameter with fp32 AdamW ({mem['llama1b']:.1f} GB for the 1.1B model, {mem['gpt2']:.1f} GB for GPT-2 "
      f"small, against 141 GB on an H200); a replica stops fitting around {141e9 / 16 / 1e9 * 0.8:.0f}B parameters "
      f"(80% of 141 GB for model states, activations not counted), and that is where ZeRO (sharding optimizer "
      f"state, gradients, parameters) becomes necessary. The limit here is the batch: " + "; ".join(
          f"{NAMES[k]} keeps > 90% up to {v['p_max']:,} GPUs within a {fmt_tokens(v['b_ref'])}-token global batch "
          f"({v['b_ref_src']})" + (f", and needs ≥ {fmt_tokens(v['b_1024'])} tokens at 1,024 GPUs" if v.get('b_1024') else "")
          for k, v in limits.items() if k != "mini") + ". Beyond that the global batch must grow past what trains "
      f"efficiently (the critical batch, {link('kaplan_bcrit')}), and ZeRO does not help: stages 1–2 move the same "
      f"bytes as the all-reduce ({link('zero')}). Then the model must be split (tensor or pipeline parallelism, "
      f"fewer DP replicas), or gradients sent in bf16 (half the bytes; mllm all-reduces fp32 today).")
    w("")
    # ---- 1. algorithm
    w("## 1. What the mpi backend's all-reduce does, and its cost model")
    w("")
    w("`framework/mllm/distributed/mpi_communicator.cpp`, `mpi_runtime.cpp`:")
    w("")
    w("- Every collective is a task on one **communication thread** per process, run in submission order; "
      "`all_reduce_async` returns at once (DataParallel's autograd hooks launch buckets this way while backward "
      "runs). Waiting polls `MPI_Test`: yields for the first 1 ms, then sleeps of 25 µs doubling to 200 µs, so a "
      "waiting rank does not take a core from backward.")
    w("- The reduction is **rank-ordered** (bitwise the same on every rank and for any bucketing): buffers "
      f"≤ {SMALL_PATH_MAX // KiB} KiB take `MPI_Iallgather` of the whole buffer and every rank sums the p rows itself "
      "(each rank receives (p−1)·n bytes); larger ones take `MPI_Ialltoallv` of 1/p slices (a reduce-scatter's "
      "traffic: (p−1)/p·n bytes out and in per rank), each rank sums its slice over the p rows, and "
      "`MPI_Iallgatherv` returns the reduced slices ((p−1)/p·n again).")
    w("")
    w("Cost model (the accounting of Thakur, Rabenseifner and Gropp, *Optimization of Collective Communication "
      "Operations in MPICH*, IJHPCA 2005, https://doi.org/10.1177/1094342005051521):")
    w("")
    w("```")
    w("large (n > 64 KiB):  T(n, p) = s(p) · [ t0 + 2(p−1)·α + 2(p−1)/p · n · β ]")
    w("small (n ≤ 64 KiB):  T(n, p) = s(p) · [ t0 + (p−1)·α  + (p−1) · n · β ]")
    w("```")
    w("")
    w("α is the cost per peer message (OpenMPI's non-blocking alltoallv and allgatherv exchange with all p−1 "
      "peers per phase: the step count of a ring), β the cost per byte *including the reduction* "
      "(2(p−1)/p·n·β = (p−1)/p·n·(2β_copy + γ): timing whole all-reduces cannot separate copying from adding), "
      "t0 the per-call overhead (the hop to the communication thread, the polling). The large-message form is "
      "exactly the ring all-reduce's 2(p−1)α + 2(p−1)/p·nβ (+ (p−1)/p·nγ). s(p) is this VM's: with p ranks "
      f"on C = {cores} vCPUs the ranks **time-share** the cores when p > C (all runs with p > 2 are "
      "oversubscribed, `mpirun --oversubscribe`), so the fitted α and β describe OpenMPI's shared-memory "
      "transport and this CPU's memory system, not a network. Three variants are fitted: s = 1 (the plain "
      "ring), s = max(1, p/C) (perfect sharing) and s = ceil(p/C) (the collective waits for the busiest core). "
      "Non-negative least squares on relative error, each regime separately.")
    w("")
    # ---- 2. measurements and fit
    w("## 2. Measured all-reduce and the fit")
    w("")
    w(f"`bench/scaling/measure.sh` runs `mllm_bench_allreduce --which mllm` at np = {', '.join(map(str, cpu['nps']))}, "
      f"4 KiB to 64 MiB in factors of 2, {int(cpu['n_reps'])} rounds over all world sizes; the fit uses the median "
      f"of the rounds (seconds per call of the slowest rank). Raw data: `bench/scaling/data/allreduce.csv`.")
    w("")
    w("Held-out error |model − measured| / measured (median / 90th percentile / max):")
    w("")
    w("| variant | A: fit even np, test odd np | A: mean | B: fit 4 KiB·4^k, test sizes between | fit on all points (median) |")
    w("|---|---|---:|---|---:|")
    for s_ in SHARES:
        r = cpu["results"][s_]
        fa = fit(s_, cpu["points"], cores)
        allerr = summary(rel_errors(s_, fa, cpu["points"], cores))
        cell = lambda t: f"{pct(t['median'])} / {pct(t['p90'])} / {pct(t['max'])}"
        mark = " **(chosen)**" if s_ == share else ""
        w(f"| `{s_}`{mark} | {cell(r['A']['test'])} | {pct(r['A']['test']['mean'])} | {cell(r['B']['test'])} | {pct(allerr['median'])} |")
    w("")
    w(f"The chosen variant has the lowest mean held-out error on world sizes (split A). On even np the two "
      f"time-sharing variants are the same model, so the odd np decide between them. Its parameters, fitted on all "
      f"{len(cpu['points'])} points:")
    w("")
    w("| regime | t0 | α (per message) | β (per byte) | 1/β |")
    w("|---|---:|---:|---:|---:|")
    for reg, label in (("large", f"large, n > {SMALL_PATH_MAX // KiB} KiB (alltoallv + allgatherv)"),
                       ("small", f"small, n ≤ {SMALL_PATH_MAX // KiB} KiB (allgather)")):
        c = coef[reg]
        inv = f"{1 / c[2] / 1e9:.2f} GB/s" if c[2] > 0 else "–"
        w(f"| {label} | {c[0] * 1e6:.1f} µs | {c[1] * 1e6:.2f} µs | {c[2] * 1e9:.3f} ns | {inv} |")
    w("")
    w("Measured median / model, by world size:")
    w("")
    show = [16 * KiB, 256 * KiB, 4 * MiB, 64 * MiB]
    w("| np | " + " | ".join(fmt_bytes(n) for n in show) + " |")
    w("|---:|" + "---:|" * len(show))
    med = {(n, p): t for n, p, t in cpu["points"]}
    for p in cpu["nps"]:
        cells = []
        for n in show:
            t = med.get((n, p))
            if t is None:
                cells.append("–")
                continue
            m = predict(share, coef, n, p, cores)
            cells.append(f"{fmt_t(t)} / {fmt_t(m)} ({(m - t) / t:+.0%})")
        w(f"| {p} | " + " | ".join(cells) + " |")
    w("")
    w("Read with care: the VM is shared with other jobs, runs at different times differ by up to 2× (see "
      "bench/README.md), and caches matter (L3 is 32 MiB: messages of a few MiB fit, 16–64 MiB do not), which "
      "a single β averages over.")
    w("")
    # ---- 3. mini check
    w("## 3. Check: predicted vs measured step time of recipes/mini.yaml on this VM")
    w("")
    if mc:
        w(f"mllm-train `recipes/mini.yaml` for {mc['steps'] + 2} steps (the first 2 dropped) at np ranks × 1 "
          f"thread (`bench/scaling/data/mini_np*.jsonl`). Prediction: the measured single-rank compute of one "
          f"global batch ({fmt_t(mc['t_c1'])} forward + backward + optimizer at np = 1) divided over p ranks that "
          f"time-share {cores} cores (× ceil(p/{cores})/p), plus the fitted all-reduce of mini's single "
          f"{mc['grad_bytes'] / 1e6:.1f} MB gradient bucket (it fits one 25 MiB bucket, which is launched when "
          f"the last gradient is ready, so nothing overlaps), plus the two small all-reduces of a step (token "
          f"count, loss) and the np = 1 remainder ({fmt_t(mc['t_other'])}: data, clipping).")
        w("")
        w("| np | compute pred. / meas. | all-reduce pred. / `comm_ms` meas. | step pred. / meas. | error |")
        w("|---:|---:|---:|---:|---:|")
        for r in mc["rows"]:
            w(f"| {r['np']} | {fmt_t(r['compute_pred'])} / {fmt_t(r['compute_meas'])} | {fmt_t(r['ar_pred'])} / "
              f"{fmt_t(r['comm_meas'])} | {fmt_t(r['step_pred'])} / {fmt_t(r['step_meas'])} | {r['err']:+.0%} |")
        w("")
        w("`comm_ms` is the wait in `finish_gradient_sync`, which also holds the skew between ranks' backward "
          "passes (large when ranks time-share cores), so it exceeds the all-reduce alone.")
    else:
        w("No mini runs in bench/scaling/data/.")
    w("")
    # ---- 4. overlap
    w("## 4. Overlap measured here")
    w("")
    if ov:
        w("`mllm_bench_overlap` at np = 2 (d512/8-layer stand-in, 33.5 M parameters, 134 MB of fp32 "
          "gradients, 1 thread per rank): hidden = (T_bwd + T_comm − T_total) / T_comm.")
        w("")
        w("| buckets | T_bwd | T_comm | T_total | hidden | all-reduce time during backward | backward slowed by |")
        w("|---|---:|---:|---:|---:|---:|---:|")
        for cap, o in sorted(ov.items(), reverse=True):
            w(f"| {o['buckets']} × ≤ {cap} MiB | {o['t_bwd']:.0f} ms | {o['t_comm']:.0f} ms | {o['t_total']:.0f} ms | "
              f"{pct(o['hidden'])} | {pct(o['concurrent'])} | {o['slowdown']:.0f} ms |")
        w("")
        w("Most of the all-reduce runs while backward does, but on CPU moving and summing gradients is itself "
          "CPU work: two ranks with one compute thread each already use both vCPUs, so backward slows by part "
          "of what runs beside it, and the net hidden fraction is what is left. It is noisy on this VM "
          "(bench/README.md has runs from −97% to +4.5%, this run's are above; backward alone varies by tens of "
          "percent between runs). It does not transfer to GPUs, where NCCL runs on its own stream and the "
          "copies use NVLink and the NICs. The GPU model below therefore gives three figures: **overlapped** "
          "(the bucket schedule of §5, all-reduce concurrent with backward at full speed), **with the hidden "
          "fraction measured here** (25 MiB row) and **serial** (nothing hidden; bench/README.md's worst run "
          "even lost time).")
    w("")
    # ---- 5. GPU model
    c = pub["constants"]
    w("## 5. The GPU model (H200, NCCL)")
    w("")
    w("**Compute.** Per optimizer step and GPU: `T_compute = accum × F × micro × seq / (MFU × peak)`, "
      "with F the FLOPs per token of mllm's own convention (`Model::flops_per_token`: 6 × parameters that "
      "multiply activations + 12 × layers × d_model × seq for attention; PaLM, Chowdhery et al. 2022, "
      f"appendix B), peak = {c['peak_bf16_dense_tflops']} TFLOP/s bf16 dense ({link('h200_spec')}: 1,979 with "
      f"sparsity) and **MFU = {MFU:.0%} (assumed**; {link('llama3_mfu')} reports 38–43% on H100s, "
      f"{link('tinyllama')} 56% on A100s). Backward is 2/3 of it. Micro-batch caps (activation "
      f"memory; **assumed**, not measured): " + ", ".join(f"{NAMES[s.key]} {s.micro_max}" for s in shapes_) +
      " sequences; more sequences per GPU are gradient accumulation, and only the last micro-step "
      "communicates.")
    w("")
    w("**Gradient bytes.** mllm keeps fp32 master weights (`train.precision: bf16` is autocast), so gradients "
      "and buckets are fp32: 4 bytes per parameter (+ one float per tensor, DataParallel's 'used' flag).")
    w("")
    w("| shape | parameters | fp32 gradients | FLOPs/token | buckets at 25 MiB | compute per sequence |")
    w("|---|---:|---:|---:|---:|---:|")
    for sh in shapes_:
        w(f"| {sh.title} | {sh.params:,} | {sh.params * 4 / 1e6:,.1f} MB | {sh.flops_per_token / 1e6:,.1f} M | "
          f"{len(plan_buckets(sh.tensors, 25 * MiB)[0])} | {fmt_t(sh.flops_per_token * sh.seq / gpu.flops)} |")
    w("")
    w("Parameter counts come from the architecture code paths mirrored in `scaling_model.py` "
      "(mini's equals mllm-train's log, 2,764,510; GPT-2's equals the published 124,439,808; the 1.1B llama "
      "is TinyLlama's 1,100,048,384, which mllm's `llama` type builds with d_ff 0 and multiple_of 256).")
    w("")
    w("**All-reduce.** Time for n bytes over p GPUs, 8 per node:")
    w("")
    w("```")
    w(f"one node (p = 8, NVSwitch):  T = α1 + 2(p−1)/p · n / B1     α1 = {nccl.alpha1 * 1e6:.1f} µs, B1 = {nccl.nvl_busbw / 1e9:.0f} GB/s")
    w(f"k nodes:  T = min over NCCL's algorithms of  L_algo(p, k) + 2(p−1)/p · n / B_algo(n)")
    w(f"   ring:     L = 1.4 × (8.4 + (2(p−1) − 2(k−1)) × 3.4 + 2(k−1) × 14.0) µs      B = B_net")
    w(f"   tree:     L = 8.4 + 2((8−1) × 4.0 + log2(k) × 14.0) µs                      B = 0.92 × c(n) × B_net")
    w(f"   NVLSTree: L = 25 + 2 log2(k) × 20.9 µs                                      B = B_net")
    w(f"   B_net = 8 NICs × 50 GB/s × {nccl.net_eff:.3f} = {nccl.net_busbw / 1e9:.0f} GB/s (bus bandwidth)")
    w("```")
    w("")
    w(f"- α1, B1: least squares (relative error) on Azure's published NCCL curve for 8× H200 "
      f"({link('azure_h200_nccl')}, NVLS, NCCL 2.20.5), 1 MiB–8 GiB (errors in the table below).")
    w(f"- L_algo: NCCL's own cost model ({link('nccl_tuner')}, NCCL 2.30.7, Simple protocol, Hopper, Intel "
      f"hosts): per-hop latencies of 3.4 µs over NVLink and 14 µs over the network for a ring, with a 1.4× "
      f"'plateau' factor for large messages; c(n) is NCCL's 0.5–0.9 tree correction for mid sizes. NCCL's "
      f"tuner picks the fastest per call, and so does the model. The network's own latency "
      f"(`latencyInter`, 0 for InfiniBand) is taken as 0.")
    w(f"- B_net: 8 × 400 Gb/s NICs per node ({link('node_nics')}); the efficiency {nccl.net_eff:.3f} is the "
      f"measured 369.06 GB/s bus bandwidth of a 16 GiB all-reduce on 4 nodes × 8 H200 over 3.2 Tb/s per node "
      f"({link('mleng_h200_4node')}; EFA rather than InfiniBand, same bandwidth per node). NVLSTree's bandwidth "
      f"is taken equal to the ring's (NCCL's model gives it the same bus bandwidth unless capped per channel). "
      f"That it holds at 128 nodes is an **assumption** (NCCL's model keeps it; routing and congestion may not).")
    w("")
    w("Checked against published curves (bus bandwidth, 1 MiB–16 GiB; |model − published| / published):")
    w("")
    w("| curve | role | median | max | sizes where the error exceeds 20% |")
    w("|---|---|---:|---:|---|")
    roles = {"azure_h200_nccl": "fitted (α1, B1)", "mleng_h200_1node": "held out: another 8× H200 node, NCCL 2.27.7",
             "mleng_b200_4node": "held out: NCCL's ring latency for 32 ranks, 4 nodes, with that system's own plateau (381.8 GB/s)"}
    for key, rows in val.items():
        e = [abs(r[3]) for r in rows]
        bad = [fmt_bytes(r[0]) for r in rows if abs(r[3]) > 0.2]
        w(f"| {link(key)} | {roles[key]} | {pct(statistics.median(e))} | {pct(max(e))} | {', '.join(bad) or '–'} |")
    w("")
    w("Latency per all-reduce call and time for two bucket sizes:")
    w("")
    w("| GPUs | nodes | ring latency | tree | NVLSTree | 25 MiB | 400 MiB | algorithm picked (25 MiB) |")
    w("|---:|---:|---:|---:|---:|---:|---:|---|")
    algo_name = {"ring": "ring", "tree": "tree", "nvlstree": "NVLSTree", "nvls": "NVLS"}
    for p in P_TABLE:
        if p <= 8:
            w(f"| {p} | 1 | – | – | – | {fmt_t(nccl.time(25 * MiB, p))} | {fmt_t(nccl.time(400 * MiB, p))} | NVLS (α1 = {fmt_t(nccl.alpha1)}) |")
        else:
            w(f"| {p:,} | {p // 8} | {fmt_t(nccl.latency('ring', p))} | {fmt_t(nccl.latency('tree', p))} | "
              f"{fmt_t(nccl.latency('nvlstree', p))} | {fmt_t(nccl.time(25 * MiB, p))} | {fmt_t(nccl.time(400 * MiB, p))} | "
              f"{algo_name[nccl.time(25 * MiB, p, with_algo=True)[1]]} |")
    w("")
    w("**Bucket schedule (overlap).** Buckets are planned as `bucket_plan.cpp` does (reverse registration "
      "order, greedy by bytes, a larger tensor alone). In the last micro-step's backward, a parameter's gradient "
      "is complete when backward has done the FLOPs that precede it (output head first, then the layers from "
      "the last, embeddings last; a tied embedding, as in GPT-2, only at the very end). A bucket is launched "
      "when its last gradient is complete and the bucket before it was launched, and buckets are all-reduced "
      "one at a time (one NCCL stream). Exposed communication = max(0, end of the last all-reduce − end of "
      "backward); T_step = T_compute + exposed; **efficiency = T_compute / T_step** (equal to the weak-scaling "
      "efficiency against one GPU, which communicates nothing). The serial bound adds every all-reduce instead. "
      "Not modelled: NCCL's kernels taking SMs from backward while they overlap it, the optimizer step and "
      "data loading (the same at every world size), stragglers.")
    w("")
    # ---- 6. predictions
    w("## 6. Predictions")
    w("")
    w("### 6.1 At each shape's reference global batch (25 MiB buckets unless said)")
    w("")
    w("Reference batches: " + "; ".join(f"{NAMES[s.key]}: {s.ref_note}" for s in shapes_) + ". Where the global "
      "batch has fewer sequences than GPUs, the row uses 1 sequence per GPU (a larger global batch) and says so.")
    w("")
    h = ctx["hidden"]
    w(f"Efficiency three ways: overlapped (the schedule of §5), with the hidden fraction measured here "
      f"(h = {pct(h)} at 25 MiB buckets, §4: exposed = max(schedule, (1 − h) × all-reduce total)), and serial.")
    w("")
    w("| shape | GPUs | seq/GPU (micro × accum) | tokens/step | T_compute | all-reduce total | exposed | step | efficiency | with measured h | best bucket | efficiency, best bucket | serial, best bucket |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for h in head:
        sh, p, r25, rb = h["shape"], h["p"], h["r25"], h["rb"]
        seqcell = f"{h['seqs']} ({r25['micro']} × {r25['accum']})" + ("" if h["fits"] else " ¹")
        effs = [gpu.run(sh, p, h["seqs"], c)["eff"] for c in CAPS_MIB]
        capcell = "any (±1%)" if max(effs) - min(effs) < 0.01 else f"{h['capb']} MiB"
        eff_h = r25["t_compute"] / (r25["t_compute"] + max(r25["exposed"], (1 - ctx["hidden"]) * r25["t_comm"]))
        w(f"| {NAMES[sh.key]} | {p:,} | {seqcell} | {fmt_tokens(h['seqs'] * p * sh.seq)} | {fmt_t(r25['t_compute'])} | "
          f"{fmt_t(r25['t_comm'])} | {fmt_t(r25['exposed'])} | {fmt_t(r25['t_step'])} | {pct(r25['eff'])} | {pct(eff_h)} | "
          f"{capcell} | {pct(rb['eff'])} | {pct(gpu.best(sh, p, h['seqs'], 'eff_serial')[0])} |")
    w("")
    w("¹ the reference global batch has fewer sequences than GPUs: 1 sequence per GPU instead.")
    w("")
    w("### 6.2 Smallest per-GPU batch for efficiency > 90%")
    w("")
    w("Over 1–512 sequences per GPU (powers of 2) and bucket caps " + ", ".join(f"{c}" for c in CAPS_MIB) +
      " MiB; 'buckets' lists the caps that reach 90% at that batch.")
    w("")
    w("| shape | GPUs | overlapped: seq/GPU | global batch | buckets reaching 90% | efficiency at 25 MiB | serial: seq/GPU | global batch |")
    w("|---|---:|---:|---:|---|---:|---:|---:|")
    for sh in shapes_:
        for p in P_TABLE:
            m, ms = minb[(sh.key, p)]
            if m:
                s, capb, ok, effs = m
                cells = [f"{s}", f"{fmt_tokens(s * p * sh.seq)} tokens", ", ".join(f"{c}" for c in ok) + " MiB", pct(effs[25])]
            else:
                cells = [f"> {SEQS[-1]}", "–", "–", "–"]
            cells += [f"{ms[0]}", f"{fmt_tokens(ms[0] * p * sh.seq)} tokens"] if ms else [f"> {SEQS[-1]}", "–"]
            w(f"| {NAMES[sh.key]} | {p:,} | " + " | ".join(cells) + " |")
    w("")
    w("### 6.3 Bucket size at 1,024 GPUs")
    w("")
    w("| shape | seq/GPU | " + " | ".join(f"{c} MiB" for c in CAPS_MIB) + " |")
    w("|---|---:|" + "---:|" * len(CAPS_MIB))
    for sh in shapes_[1:]:
        for s in (1, 2, 4, 8):
            w(f"| {NAMES[sh.key]} | {s} | " + " | ".join(pct(gpu.run(sh, 1024, s, c)['eff']) for c in CAPS_MIB) + " |")
    w("")
    w("Small buckets lose to latency (one tree all-reduce per bucket); very large ones lose because the last "
      "bucket, holding the first layers and the embedding, is all-reduced after backward has ended.")
    w("")
    w("### 6.4 Sensitivity to the assumed MFU")
    w("")
    w("Smallest sequences per GPU for > 90% (overlapped, best bucket). A higher MFU shortens compute, so the "
      "same all-reduce needs a larger batch to hide behind.")
    w("")
    w("| shape | GPUs | MFU 30% | MFU 40% | MFU 55% |")
    w("|---|---:|---:|---:|---:|")
    for sh in shapes_[1:]:
        for p in P_TABLE:
            cells = []
            for mfu in (0.30, 0.40, 0.55):
                m = sens[(mfu, sh.key, p)]
                cells.append(f"{m[0]} ({fmt_tokens(m[0] * p * sh.seq)})" if m else f"> {SEQS[-1]}")
            w(f"| {NAMES[sh.key]} | {p:,} | " + " | ".join(cells) + " |")
    w("")
    # ---- 7. where DP stops
    w("## 7. Where data parallelism alone stops scaling")
    w("")
    w(f"**Memory** (not the limit here). Every DP rank holds the full model state: fp32 weights, gradients "
      f"(the bucket buffers) and AdamW's two moments = 16 bytes per parameter ({link('zero')} counts the same 16 "
      f"bytes for mixed-precision Adam). " + ", ".join(f"{NAMES[s.key]}: {s.params * 16 / 1e9:.2f} GB" for s in shapes_) +
      f", against 141 GB (H200) or 80 GB (H100), before activations. A replica stops fitting near "
      f"{141e9 * 0.8 / 16 / 1e9:.0f}B parameters on an H200 ({80e9 * 0.8 / 16 / 1e9:.0f}B on an H100) if 20% is "
      f"left for activations; there ZeRO-1/2/3 (shard optimizer state / + gradients / + parameters over the DP "
      f"ranks) or model parallelism is needed.")
    w("")
    w("**Batch** (the limit here). More GPUs at a fixed per-GPU batch means a larger global batch, and beyond the "
      f"critical batch more tokens per step stop buying proportionally fewer steps ({link('kaplan_bcrit')}: "
      f"B_crit ≈ 2·10⁸ / L^4.8 tokens, about 1M tokens at a loss of 3.0 nats and 2.5M at 2.5; in practice "
      f"{link('gpt3_batch')} used 0.5M tokens for 125M parameters and 1M for 1.3B, TinyLlama 2M for 1.1B, "
      f"{link('llama2_batch')} 4M for 7B–70B). "
      f"With the batch each shape was trained with as the ceiling:")
    w("")
    w("| shape | reference global batch | > 90% up to (GPUs) | global batch needed for > 90% at 1,024 GPUs | serial bound: up to |")
    w("|---|---:|---:|---:|---:|")
    for k, v in limits.items():
        upto = lambda x: f"{x:,}" if x else f"none (not even {P_CURVE[0]})"
        w(f"| {NAMES[k]} | {fmt_tokens(v['b_ref'])} tokens ({v['b_ref_src']}) | {upto(v['p_max'])} | "
          f"{(fmt_tokens(v['b_1024']) + ' tokens') if v.get('b_1024') else 'not reached'} | {upto(v['p_max_serial'])} |")
    w("")
    w("Past those points DP alone needs a batch larger than useful. ZeRO does not change that (its stages 1 "
      "and 2 communicate exactly the all-reduce's bytes, stage 3 1.5×); what does is fewer DP replicas of a "
      "split model (tensor parallelism inside a node, pipeline parallelism across nodes), cheaper bytes (bf16 "
      "gradient all-reduce: half the bandwidth term), or larger buckets where latency dominates.")
    w("")
    # ---- 8. sources
    w("## 8. Sources")
    w("")
    for key, s_ in src.items():
        extra = f" (commit {s_['commit'][:12]})" if "commit" in s_ else ""
        also = f"; also {s_['also']}" if "also" in s_ else ""
        w(f"- **{s_['label']}**: {s_['what']}. {s_['url']}{extra}{also}")
    w("- **Thakur et al. 2005**: R. Thakur, R. Rabenseifner, W. Gropp, Optimization of Collective Communication "
      "Operations in MPICH, IJHPCA 19(1), 2005: the α-β(-γ) costs of ring and reduce-scatter + allgather "
      "all-reduce. https://doi.org/10.1177/1094342005051521")
    w("- **PaLM**: Chowdhery et al. 2022, PaLM, appendix B: model FLOPs per token = 6N + 12·L·H·Q·T. "
      "https://arxiv.org/abs/2204.02311")
    w("")
    # ---- 9. caveats
    w("## 9. Measured, published, assumed")
    w("")
    w("- **Measured here** (bench/scaling/data/): our all-reduce at np 2–8 on 2 vCPUs (np > 2 time-shared), "
      "the overlap bench at np 2, mini's step at np 1, 2, 4, 8. One shared VM, noisy; a rerun moves numbers "
      "by tens of percent, not the conclusions.")
    w("- **Published**: H200 peak and memory, NICs per node and their speed, NCCL all-reduce curves (one node: Azure, "
      "ml-engineering; four nodes: ml-engineering on AWS EFA, not InfiniBand), NCCL's latency constants, "
      "parameter shapes, batch sizes, the critical-batch fit, ZeRO's memory accounting.")
    w(f"- **Assumed**: MFU {MFU:.0%} for every shape (small models reach less, which *raises* their DP "
      "efficiency; §6.4), the micro-batch caps, that the 4-node network efficiency holds at 128 nodes, NVLSTree "
      "at the ring's bandwidth, gradient readiness proportional to backward FLOPs, perfect overlap (upper "
      "bound) or none (lower bound), no stragglers. For mini on GPUs the FLOP-based compute time (microseconds) "
      "is meaningless: kernel launches dominate such a small model, so its GPU rows are a lower bound.")
    w("- The fitted CPU constants describe this VM's shared-memory MPI under time-sharing, not a cluster "
      "network; on real CPU nodes rerun `bench/scaling/run.sh` there.")
    w("")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(L))


def dp_limits(gpu, shapes_, minb):
    refs = {"mini": (None, "recipes/mini.yaml"), "gpt2": (0.5e6, "GPT-3's for 125M"),
            "llama1b": (2 * 1024 * 1024, "TinyLlama's")}
    out = {}
    for sh in shapes_:
        b_ref = sh.ref_global_seqs * sh.seq
        src = refs[sh.key][1]
        p_max = p_ser = 0
        for p in P_CURVE:
            m, ms = minb[(sh.key, p)]
            if m and m[0] * p * sh.seq <= b_ref * 1.0001:
                p_max = p
            if ms and ms[0] * p * sh.seq <= b_ref * 1.0001:
                p_ser = p
        m1024 = minb[(sh.key, 1024)][0]
        out[sh.key] = {"b_ref": b_ref, "b_ref_src": src, "p_max": p_max, "p_max_serial": p_ser,
                       "b_1024": m1024[0] * 1024 * sh.seq if m1024 else None}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--published", default=os.path.join(HERE, "published.json"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "scaling.md"))
    ap.add_argument("--png", default=os.path.join(ROOT, "docs", "scaling.png"))
    ap.add_argument("--gnuplot", default="gnuplot")
    args = ap.parse_args()
    pub = json.load(open(args.published, encoding="utf-8"))
    machine = read_machine(args.data)
    cores = int(machine.get("cores", "2"))
    cpu = cpu_fit(load_allreduce(os.path.join(args.data, "allreduce.csv")), cores)
    mini_vocab = 9694  # the char vocabulary of data/full/tang.jsonl (mllm-train's log)
    shapes_ = shapes(mini_vocab)
    assert shapes_[0].params == 2764510 and shapes_[1].params == 124439808 and shapes_[2].params == 1100048384
    mc = mini_check(args.data, cpu, shapes_[0])
    ov = {}
    for cap in (25, 4):
        o = parse_overlap(os.path.join(args.data, f"overlap_b{cap}.txt"))
        if o:
            ov[cap] = o
    # The hidden fraction measured here with 25 MiB buckets, clamped to [0, 1] (noise can push it out).
    hidden = min(1.0, max(0.0, ov[25]["hidden"])) if 25 in ov else 0.0
    nccl = Nccl(pub)
    val = validate_gpu(pub, nccl)
    gpu, head, minb, sens = analyse(pub, shapes_, nccl)
    limits = dp_limits(gpu, shapes_, minb)
    plot(args.png, args.gnuplot, cpu, pub, nccl, shapes_, gpu)
    write_doc(args.doc, {"cpu": cpu, "mini": mc, "overlap": ov, "pub": pub, "nccl": nccl, "shapes": shapes_,
                         "gpu": gpu, "head": head, "minb": minb, "sens": sens, "val": val, "machine": machine,
                         "limits": limits, "hidden": hidden})
    a = cpu["results"][cpu["chosen"]]["A"]["test"]
    print(f"scaling_model: {cpu['chosen']}: alpha {cpu['final']['large'][1] * 1e6:.2f} us, "
          f"1/beta {1 / cpu['final']['large'][2] / 1e9:.2f} GB/s; held-out (odd np) median {a['median']:.0%}; "
          f"wrote {args.doc} and {args.png}")


if __name__ == "__main__":
    main()
