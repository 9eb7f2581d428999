#!/usr/bin/env python3
"""PyTorch reference for mllm checkpoints, independent of mllm's C++ code.

    torch_reference.py val-loss CHECKPOINT [--batches B] [--cache-dir DIR]
                                           [--device cpu|cuda] [--bf16]
    torch_reference.py train-speed --type llama|minillm --vocab V --d-model D --n-heads H
                                   [--n-kv-heads K] --n-layers L [--d-ff F] --seq-len T
                                   --micro-batch B [--steps N] [--bf16] [--sdpa] [--device cuda]
                                   [--compile] [--profile-steps P --trace FILE]

train-speed --compile runs the model through torch.compile (TorchInductor, its default mode: what
a PyTorch user runs for speed; --compile-backend another backend); its warm-up steps include the
compilation. --profile-steps P records P more steps after the timed ones with torch.profiler (CPU,
and CUDA on a GPU) and writes their Chrome trace to FILE (what launch/gpu_check_report.py
trace-kernels counts).

CHECKPOINT is a checkpoint folder, or a run / checkpoints folder (its `latest` is used).
Loads the weights of that checkpoint (model.safetensors, parsed here by the
safetensors format: 8-byte little-endian header size, JSON header, raw little-endian data) into
the plain-PyTorch models of tests/assets/model/make_golden.py (minillm = the peer's ddp_ref.py
MiniLLM, llama = Meta's LLaMA-2 layout), reads the validation shard the run trained with
(<data.cache_dir>/<data fingerprint>/val-*.bin, format in docs/data.md) and computes the validation loss exactly as
mllm's evaluation defines it: packed windows i = tokens[i*seq_len : (i+1)*seq_len + 1], the first
min(B * micro_batch, windows) of them (the same at any world size), cross-entropy summed over targets that are not <PAD>
(id 0) and divided by their count. Prints one JSON line: {"val_loss", "tokens", "sequences"}.

Settings come from CHECKPOINT/recipe.yaml (written by mllm): model shape, data.seq_len,
data.cache_dir (relative to the working directory of the run), train.micro_batch,
eval.batches.
"""
import argparse
import glob
import json
import math
import os
import statistics
import struct
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "assets", "model"))
import make_golden as ref  # noqa: E402  (the independent PyTorch models)

PAD = 0


def read_recipe(path):
    """The resolved recipe mllm writes (to_yaml): top-level sections of `key: value` lines,
    nested maps indented by two spaces, lists as `- item` lines. Returns {"sec.key": str}."""
    out, stack = {}, []
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not line.strip() or line.lstrip().startswith(("#", "- ")):
                continue
            depth = (len(line) - len(line.lstrip(" "))) // 2
            key, _, value = line.strip().partition(":")
            stack = stack[:depth] + [key]
            if value.strip():
                out[".".join(stack)] = value.strip()
    return out


def load_safetensors(path):
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtypes[info["dtype"]])
        out[name] = t.reshape(info["shape"]).clone()
    return out


def read_shard_tokens(path):
    """(tokens int64, vocab size) of one mllm shard (docs/data.md, shard version 1)."""
    with open(path, "rb") as f:
        head = f.read(64)
        magic, version, size, count, docs, vocab = struct.unpack("<8sIIQQQ", head[:40])
        if magic != b"MLLMTOKS" or version != 1:
            sys.exit(f"torch_reference: {path} is not an mllm shard (version 1)")
        raw = f.read(count * size)
    dtype = {2: torch.uint16, 4: torch.int32}[size]
    return torch.frombuffer(bytearray(raw), dtype=dtype).to(torch.int64), vocab


def val_shards(cache_dir, tokenizer_fingerprint):
    """The val shards of the cache sub-folder (<cache_dir>/<data fingerprint>/, manifest
    version 2) whose tokenizer is the checkpoint's."""
    for manifest in sorted(glob.glob(os.path.join(cache_dir, "*", "manifest.json"))):
        m = json.load(open(manifest))
        if m.get("version") == 2 and m.get("tokenizer_fingerprint") == tokenizer_fingerprint:
            folder = os.path.dirname(manifest)
            return [os.path.join(folder, s["file"]) for s in m["val"]["shards"]]
    sys.exit(f"torch_reference: no prepared data in {cache_dir} has tokenizer "
             f"{tokenizer_fingerprint}; run mllm-prepare")


def read_val_windows(paths, seq_len):
    """Packed windows [n, seq_len + 1] int64 of the concatenated shards `paths`."""
    parts = [read_shard_tokens(p) for p in paths]
    tokens, vocab = torch.cat([t for t, _ in parts]), parts[0][1]
    count = tokens.numel()
    n = (count - 1) // seq_len
    idx = torch.arange(n).unsqueeze(1) * seq_len + torch.arange(seq_len + 1).unsqueeze(0)
    return tokens[idx], vocab


def build_model(r, vocab, seq_len):
    typ = r["model.type"]
    d, h, layers = int(r["model.d_model"]), int(r["model.n_heads"]), int(r["model.n_layers"])
    d_ff = int(r["model.d_ff"])
    max_seq = int(r["model.max_seq_len"]) or seq_len
    if typ == "minillm":
        return ref.MiniLLM(vocab, d, h, layers, d_ff or 4 * d, max_seq, dropout=0.0)
    if typ == "llama":
        kv = int(r["model.n_kv_heads"]) or h
        hidden = d_ff or ref.llama_ffn_hidden(d, int(r["model.multiple_of"]))
        return ref.Llama(vocab, d, h, kv, layers, hidden, max_seq, float(r["model.rope_theta"]),
                         float(r["model.norm_eps"]), r["model.tie_embeddings"] == "true")
    sys.exit(f"torch_reference: model.type {typ} has no reference model")


def checkpoint_folder(path):
    """A checkpoint folder, or the `latest` file of a checkpoints folder / run folder naming one."""
    for latest in (path, os.path.join(path, "latest"), os.path.join(path, "checkpoints", "latest")):
        if os.path.isfile(latest):
            with open(latest) as f:
                return os.path.join(os.path.dirname(latest), f.read().strip())
    return path


def val_loss(args):
    args.checkpoint = checkpoint_folder(args.checkpoint)
    r = read_recipe(os.path.join(args.checkpoint, "recipe.yaml"))
    if r["data.mode"] != "packed":
        sys.exit("torch_reference: only data.mode packed is supported")
    seq_len = int(r["data.seq_len"])
    cache = args.cache_dir or r["data.cache_dir"]
    with open(os.path.join(args.checkpoint, "tokenizer.mllm"), "rb") as f:
        tok_fp = json.loads(f.readline())["fingerprint"]
    windows, vocab = read_val_windows(val_shards(cache, tok_fp), seq_len)
    micro, batches = int(r["train.micro_batch"]), args.batches or int(r["eval.batches"])
    windows = windows[: min(batches * micro, windows.shape[0])]

    model = build_model(r, vocab, seq_len)
    weights = load_safetensors(os.path.join(args.checkpoint, "model.safetensors"))
    missing = sorted(set(model.state_dict()) - set(weights))
    if missing:
        sys.exit(f"torch_reference: the checkpoint lacks {missing[:5]}")
    model.load_state_dict({k: weights[k] for k in model.state_dict()})
    if hasattr(model, "freqs_cis"):
        model.freqs_cis = model.freqs_cis.to(args.device)
    model.to(args.device).eval()

    total, count = 0.0, 0
    with torch.no_grad(), torch.autocast(args.device, torch.bfloat16, enabled=args.bf16):
        for start in range(0, windows.shape[0], micro):
            w = windows[start:start + micro].to(args.device)
            logits = model(w[:, :-1]).float()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                   ignore_index=PAD, reduction="sum")
            total += loss.item()
            count += int((w[:, 1:] != PAD).sum())
    print(json.dumps({"val_loss": total / count, "tokens": count, "sequences": windows.shape[0],
                      "ppl": math.exp(total / count)}))


def train_speed(args):
    """The PyTorch baseline of a training shape, eager or with --compile: AdamW (fused on CUDA),
    clipping at 1.0, optional bf16 autocast, random tokens in [1, vocab). One JSON line: tokens/s
    (median step after --warmup untimed steps), peak memory, parameters, model FLOPs per token,
    losses (the last one of the profiled steps, when there are)."""
    dev = torch.device(args.device)
    ref.LLAMA_SDPA = args.sdpa
    torch.manual_seed(0)
    if args.type == "llama":
        hidden = args.d_ff or ref.llama_ffn_hidden(args.d_model, args.multiple_of)
        model = ref.Llama(args.vocab, args.d_model, args.n_heads, args.n_kv_heads or args.n_heads,
                          args.n_layers, hidden, args.seq_len, 10000.0, 1e-5, args.tie)
        model.freqs_cis = model.freqs_cis.to(dev)
        tables = args.vocab * args.d_model
    else:
        model = ref.MiniLLM(args.vocab, args.d_model, args.n_heads, args.n_layers,
                            args.d_ff or 4 * args.d_model, args.seq_len, dropout=0.0)
        tables = (args.vocab + args.seq_len) * args.d_model
    with torch.no_grad():  # GPT-2 / mllm init: N(0, 0.02) matrices and tables, zero biases
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
            elif name.endswith("bias"):
                p.zero_()
    model.to(dev).train()
    params = sum(p.numel() for p in model.parameters())
    forward = torch.compile(model, backend=args.compile_backend) if args.compile else model
    # mllm's convention (model.h flops_per_token): 6 x the parameters of the matrix products
    # (not the tables; a head tied to the token table is a product) + attention.
    head = args.vocab * args.d_model if args.type == "llama" and args.tie else 0
    flops = 6 * (params - tables + head) + 12 * args.n_layers * args.d_model * args.seq_len
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95),
                            fused=dev.type == "cuda")
    gen = torch.Generator(device="cpu").manual_seed(1)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times, losses = [], []

    def train_step():
        ids = torch.randint(1, args.vocab, (args.micro_batch, args.seq_len + 1), generator=gen).to(dev)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, torch.bfloat16, enabled=args.bf16):
            logits = forward(ids[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), ids[:, 1:].reshape(-1),
                               ignore_index=PAD)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())  # synchronises
        sync()
        return time.perf_counter() - t0

    t_warmup = time.perf_counter()
    for _ in range(args.warmup):  # with --compile, the compilation happens here
        train_step()
    warmup_s = time.perf_counter() - t_warmup
    for _ in range(args.steps):
        times.append(train_step())
    if args.profile_steps:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if dev.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(args.profile_steps):
                train_step()
        prof.export_chrome_trace(args.trace)
    step_s = statistics.median(times)
    tps = args.micro_batch * args.seq_len / step_s
    print(json.dumps({
        "tokens_per_s": tps, "step_ms_median": step_s * 1e3, "params": params,
        "flops_per_token": flops, "achieved_tflops": flops * tps / 1e12,
        "peak_mem_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
        "loss_first": losses[0], "loss_last": losses[-1], "bf16": args.bf16, "sdpa": args.sdpa,
        "compile": args.compile and args.compile_backend, "warmup_s": warmup_s,
        "profiled_steps": args.profile_steps,
        "device": str(dev), "torch": torch.__version__}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("val-loss", help="validation loss of a checkpoint's weights")
    v.add_argument("checkpoint")
    v.add_argument("--batches", type=int, default=0, help="eval batches (default: eval.batches)")
    v.add_argument("--cache-dir", default="", help="data.cache_dir (default: the recipe's)")
    v.add_argument("--device", default="cpu")
    v.add_argument("--bf16", action="store_true", help="bf16 autocast, as train.precision=bf16")
    t = sub.add_parser("train-speed", help="tokens/s of the PyTorch eager baseline of a shape")
    t.add_argument("--type", choices=["llama", "minillm"], default="llama")
    for name, default in [("vocab", 0), ("d-model", 0), ("n-heads", 0), ("n-kv-heads", 0),
                          ("n-layers", 0), ("d-ff", 0), ("multiple-of", 32), ("seq-len", 0),
                          ("micro-batch", 0), ("steps", 20), ("warmup", 3)]:
        t.add_argument("--" + name, type=int, default=default, required=default == 0 and name not in
                       ("n-kv-heads", "d-ff"))
    t.add_argument("--tie", action="store_true", help="llama: head tied to the token embedding")
    t.add_argument("--bf16", action="store_true")
    t.add_argument("--sdpa", action="store_true", help="llama attention through F.scaled_dot_product_attention")
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    t.add_argument("--threads", type=int, default=0, help="CPU threads (default: all)")
    t.add_argument("--compile", action="store_true", help="the model through torch.compile")
    t.add_argument("--compile-backend", default="inductor",
                   help="torch.compile's backend (aot_eager: the tracing without code generation)")
    t.add_argument("--profile-steps", type=int, default=0,
                   help="profile this many steps after the timed ones (needs --trace)")
    t.add_argument("--trace", default="", help="the Chrome trace of the profiled steps")
    args = p.parse_args()
    if getattr(args, "profile_steps", 0) and not args.trace:
        p.error("--profile-steps needs --trace FILE")
    torch.set_num_threads(getattr(args, "threads", 0) or max(1, os.cpu_count() or 1))
    (val_loss if args.cmd == "val-loss" else train_speed)(args)


if __name__ == "__main__":
    main()
