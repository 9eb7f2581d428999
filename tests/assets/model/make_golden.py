#!/usr/bin/env python3
"""Golden values for the model parity tests (tests/unit/model/golden_test.cpp).

Builds tiny models in plain PyTorch, independently of the C++ code, fills them with seeded
random weights, runs a fixed batch (a full row, a right-padded row, a left-padded row and an
all-pad row) and writes, per case:
  golden_<case>.pt   torch.save of a flat dict of tensors (read by torch::pickle_load):
                     "tokens" [B,T] int64, "targets" [B,T] int64, "logits" [B,T,V] float32,
                     "loss_sum" [] float32 (cross-entropy summed over targets != 0),
                     "loss_mean" [] float32 (the same, averaged: CrossEntropyLoss(ignore_index=0)),
                     and every parameter as "param.<name>" float32.
  golden_<case>.json the model config of the case (keys as in the recipe's model: section).

Cases:
  minillm     the peer baseline's MiniLLM (classes copied verbatim from shared/peer/ddp_ref.py;
              when that file is reachable the copy is also checked against it).
  llama       a LLaMA-2-style decoder written here: RMSNorm pre-norm, rotary embeddings in
              Meta's convention (llama/model.py: consecutive pairs (2i, 2i+1) rotated as complex
              numbers by pos * theta^(-2i/head_dim)), SwiGLU, grouped KV heads (Meta repeat_kv),
              no biases, final RMSNorm, untied head.
  llama_tied  the same with n_kv_heads == n_heads and the head sharing the token embedding.
Masks follow the peer exactly: causal & key-not-pad, masked_fill(~mask, -1e9), softmax.

Run:  .venv/bin/python3 tests/assets/model/make_golden.py   (torch 2.11 from launch/install-deps.sh;
      writes next to itself; values agree with the torch 1.13 ones to 4e-6)
"""
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = "/work/shared/peer/ddp_ref.py"
PAD = 0
LLAMA_SDPA = False  # goldens: explicit attention; bench/torch_reference.py may switch it on


# ---- MiniLLM: verbatim copy of shared/peer/ddp_ref.py -----------------------------------
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.o_proj = nn.Linear(d_model, d_model)

    def forward(self, x, mask):
        # x: (B, T, d); mask: (B, 1, T, T) bool, True = may attend
        b, t, d = x.shape
        h, dk = self.n_heads, self.d_k
        q = self.q_proj(x).view(b, t, h, dk).transpose(1, 2)  # (B, h, T, dk)
        k = self.k_proj(x).view(b, t, h, dk).transpose(1, 2)
        v = self.v_proj(x).view(b, t, h, dk).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(dk)
        scores = scores.masked_fill(~mask, -1e9)
        attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v)  # (B, h, T, dk)
        out = out.transpose(1, 2).contiguous().view(b, t, d)
        return self.o_proj(out)


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)
        self.ffn = FeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.drop1 = nn.Dropout(dropout)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x, mask):
        x = self.norm1(x + self.drop1(self.attn(x, mask)))  # post-LN
        x = self.norm2(x + self.drop2(self.ffn(x)))
        return x


class MiniLLM(nn.Module):
    def __init__(self, vocab, d_model, n_heads, n_layers, d_ff, max_seq_len,
                 dropout=0.1, pad_id=0):
        super().__init__()
        self.d_model = d_model
        self.pad_id = pad_id
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(max_seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            [DecoderLayer(d_model, n_heads, d_ff, dropout) for _ in range(n_layers)])
        self.lm_head = nn.Linear(d_model, vocab)

    def forward(self, ids):
        b, t = ids.shape
        pos = torch.arange(t, device=ids.device).unsqueeze(0)  # (1, T)
        x = self.tok_emb(ids) * math.sqrt(self.d_model) + self.pos_emb(pos)
        x = self.drop(x)
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool, device=ids.device))
        pad = (ids != self.pad_id).view(b, 1, 1, t)            # keys that are not pad
        mask = causal.view(1, 1, t, t) & pad                    # (B, 1, T, T)
        for layer in self.layers:
            x = layer(x, mask)
        return self.lm_head(x)                                  # (B, T, V)


# ---- LLaMA-2-style decoder, written for this script ---------------------------------------
def llama_ffn_hidden(d_model, multiple_of):
    hidden = int(2 * (4 * d_model) / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_freqs_cis(head_dim, end, theta):
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    t = torch.arange(end, dtype=torch.float32)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64 [end, head_dim/2]


def apply_rope(x, freqs_cis):
    # x [B, T, H, hd]: pairs (2i, 2i+1) as one complex number (Meta llama/model.py).
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs_cis.view(1, x.shape[1], 1, -1)).flatten(3)
    return out.type_as(x)


class LlamaAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        self.h, self.kv, self.hd = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.hd, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(n_heads * self.hd, d_model, bias=False)

    def forward(self, x, mask, freqs_cis):
        b, t, _ = x.shape
        q = apply_rope(self.q_proj(x).view(b, t, self.h, self.hd), freqs_cis)
        k = apply_rope(self.k_proj(x).view(b, t, self.kv, self.hd), freqs_cis)
        v = self.v_proj(x).view(b, t, self.kv, self.hd)
        rep = self.h // self.kv  # Meta repeat_kv: kv head j serves query heads j*rep .. j*rep+rep-1
        k = k[:, :, :, None, :].expand(b, t, self.kv, rep, self.hd).reshape(b, t, self.h, self.hd)
        v = v[:, :, :, None, :].expand(b, t, self.kv, rep, self.hd).reshape(b, t, self.h, self.hd)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        if LLAMA_SDPA:  # bench/torch_reference.py's speed runs: the fused kernel (no padding there)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.hd)
            attn = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)
            out = torch.matmul(attn, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.h * self.hd))


class SwiGLU(nn.Module):
    def __init__(self, d_model, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, hidden, eps):
        super().__init__()
        self.attn_norm = RMSNorm(d_model, eps)
        self.attn = LlamaAttention(d_model, n_heads, n_kv_heads)
        self.ffn_norm = RMSNorm(d_model, eps)
        self.ffn = SwiGLU(d_model, hidden)

    def forward(self, x, mask, freqs_cis):
        x = x + self.attn(self.attn_norm(x), mask, freqs_cis)
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab, d_model, n_heads, n_kv_heads, n_layers, hidden, max_seq_len,
                 rope_theta, eps, tie):
        super().__init__()
        self.tie = tie
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(
            [LlamaBlock(d_model, n_heads, n_kv_heads, hidden, eps) for _ in range(n_layers)])
        self.norm = RMSNorm(d_model, eps)
        if not tie:
            self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.freqs_cis = rope_freqs_cis(d_model // n_heads, max_seq_len, rope_theta)

    def forward(self, ids):
        b, t = ids.shape
        x = self.tok_emb(ids)
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool, device=ids.device))
        mask = causal.view(1, 1, t, t) & (ids != PAD).view(b, 1, 1, t)
        for layer in self.layers:
            x = layer(x, mask, self.freqs_cis[:t])
        x = self.norm(x)
        return F.linear(x, self.tok_emb.weight) if self.tie else self.lm_head(x)


# ---- cases -------------------------------------------------------------------------------
def fill_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def batch(vocab, seq, seed):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (4, seq), generator=g)
    targets = torch.randint(1, vocab, (4, seq), generator=g)
    tokens[1, seq - 3:] = PAD   # right-padded
    targets[1, seq - 4:] = PAD
    tokens[2, :2] = PAD         # left-padded (rows whose keys are all pad: uniform attention)
    targets[2, :2] = PAD
    tokens[3, :] = PAD          # all pad
    targets[3, :] = PAD
    return tokens, targets


def run_case(name, cfg, model, seed):
    fill_weights(model, seed)
    model.eval()
    tokens, targets = batch(cfg["vocab_size"], cfg["seq"], seed + 1)
    with torch.no_grad():
        logits = model(tokens)
    flat = logits.reshape(-1, logits.shape[-1])
    loss_sum = F.cross_entropy(flat, targets.reshape(-1), ignore_index=PAD, reduction="sum")
    loss_mean = F.cross_entropy(flat, targets.reshape(-1), ignore_index=PAD)
    assert torch.isfinite(logits).all()
    out = {"tokens": tokens, "targets": targets, "logits": logits.contiguous(),
           "loss_sum": loss_sum, "loss_mean": loss_mean}
    for pname, p in model.named_parameters():
        out["param." + pname] = p.detach().clone().contiguous()
    torch.save(out, os.path.join(HERE, f"golden_{name}.pt"))
    with open(os.path.join(HERE, f"golden_{name}.json"), "w") as f:
        json.dump(cfg, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{name}: params {sum(p.numel() for p in model.parameters())}, "
          f"loss_sum {loss_sum.item():.6f}, loss_mean {loss_mean.item():.6f}")
    return model, tokens, logits


def main():
    torch.set_num_threads(1)
    mini = {"type": "minillm", "vocab_size": 37, "d_model": 16, "n_heads": 2, "n_layers": 2,
            "d_ff": 32, "max_seq_len": 8, "seq": 7, "dropout": 0.0, "norm_eps": 1e-5}
    model = MiniLLM(37, 16, 2, 2, 32, 8, dropout=0.0)
    model, tokens, logits = run_case("minillm", mini, model, 100)
    if os.path.exists(PEER):  # the copy above must be the peer's model
        sys.path.insert(0, os.path.dirname(PEER))
        import ddp_ref
        peer = ddp_ref.MiniLLM(37, 16, 2, 2, 32, 8, dropout=0.0)
        peer.load_state_dict(model.state_dict())
        peer.eval()
        with torch.no_grad():
            assert torch.equal(peer(tokens), logits), "copy differs from ddp_ref.MiniLLM"
        print("minillm: identical to", PEER)

    llama = {"type": "llama", "vocab_size": 37, "d_model": 16, "n_heads": 4, "n_kv_heads": 2,
             "n_layers": 2, "d_ff": 0, "multiple_of": 16, "max_seq_len": 8, "seq": 7,
             "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": False, "dropout": 0.0}
    hidden = llama_ffn_hidden(16, 16)
    assert hidden == 48
    run_case("llama", llama, Llama(37, 16, 4, 2, 2, hidden, 8, 10000.0, 1e-5, False), 200)

    tied = dict(llama, n_heads=2, n_kv_heads=2, multiple_of=32, rope_theta=500000.0,
                norm_eps=1e-6, tie_embeddings=True)
    hidden = llama_ffn_hidden(16, 32)
    assert hidden == 64
    run_case("llama_tied", tied, Llama(37, 16, 2, 2, 2, hidden, 8, 500000.0, 1e-6, True), 300)


if __name__ == "__main__":
    main()
