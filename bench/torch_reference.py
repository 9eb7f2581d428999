#!/usr/bin/env python3
"""PyTorch reference for mllm checkpoints, independent of mllm's C++ code.

    torch_reference.py val-loss CHECKPOINT [--world W] [--batches B] [--cache-dir DIR]
                                           [--device cpu|cuda] [--bf16]

CHECKPOINT is a checkpoint folder, or a run / checkpoints folder (its `latest` is used).
Loads the weights of that checkpoint (model.safetensors, parsed here by the
safetensors format: 8-byte little-endian header size, JSON header, raw little-endian data) into
the plain-PyTorch models of tests/assets/model/make_golden.py (minillm = the peer's ddp_ref.py
MiniLLM, llama = Meta's LLaMA-2 layout), reads the validation shard the run trained with
(<data.cache_dir>/val.bin, format in docs/data.md) and computes the validation loss exactly as
mllm's evaluation defines it: packed windows i = tokens[i*seq_len : (i+1)*seq_len + 1], the first
min(B * micro_batch * W, windows) of them, cross-entropy summed over targets that are not <PAD>
(id 0) and divided by their count. Prints one JSON line: {"val_loss", "tokens", "sequences"}.

Settings come from CHECKPOINT/recipe.yaml (written by mllm): model shape, data.seq_len,
data.cache_dir (relative to the working directory of the run), train.micro_batch,
eval.batches; W defaults to the world size in CHECKPOINT/state.json.
"""
import argparse
import json
import math
import os
import struct
import sys

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


def read_val_windows(path, seq_len):
    """Packed windows [n, seq_len + 1] int64 of an mllm shard (docs/data.md, version 1)."""
    with open(path, "rb") as f:
        head = f.read(64)
        magic, version, size, count, docs, vocab = struct.unpack("<8sIIQQQ", head[:40])
        if magic != b"MLLMTOKS" or version != 1:
            sys.exit(f"torch_reference: {path} is not an mllm shard (version 1)")
        raw = f.read(count * size)
    dtype = {2: torch.uint16, 4: torch.int32}[size]
    tokens = torch.frombuffer(bytearray(raw), dtype=dtype).to(torch.int64)
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
    windows, vocab = read_val_windows(os.path.join(cache, "val.bin"), seq_len)
    with open(os.path.join(args.checkpoint, "state.json")) as f:
        world = args.world or json.load(f)["world_size"]
    micro, batches = int(r["train.micro_batch"]), args.batches or int(r["eval.batches"])
    windows = windows[: min(batches * micro * world, windows.shape[0])]

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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("val-loss", help="validation loss of a checkpoint's weights")
    v.add_argument("checkpoint")
    v.add_argument("--world", type=int, default=0, help="ranks of the evaluation (default: state.json)")
    v.add_argument("--batches", type=int, default=0, help="eval batches (default: eval.batches)")
    v.add_argument("--cache-dir", default="", help="data.cache_dir (default: the recipe's)")
    v.add_argument("--device", default="cpu")
    v.add_argument("--bf16", action="store_true", help="bf16 autocast, as train.precision=bf16")
    args = p.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    val_loss(args)


if __name__ == "__main__":
    main()
