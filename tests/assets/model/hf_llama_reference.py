#!/usr/bin/env python3
"""The published Llama forward pass in transformers' weight layout, written from the architecture
(Touvron et al. 2023; transformers' LlamaForCausalLM conventions: rotate_half rotary, RMSNorm
with the weight applied after normalising in float32, SwiGLU MLP, grouped KV heads), reading
only an exported folder (config.json + model.safetensors). Used by tests/e2e/hf_export.sh:

    hf_llama_reference.py compare EXPORTED_DIR MLLM_CHECKPOINT [--atol 1e-5]

computes the logits of fixed token sequences with this model and with make_golden.Llama on the
mllm checkpoint (Meta's interleaved rotary layout, mllm's names; the model the golden and
reference-parity tests hold mllm to), prints the max abs difference and exits 1 above atol.
With `transformers` installed it also loads the folder with AutoModelForCausalLM and compares
(atol 1e-4, or the given one if larger), and checks that AutoTokenizer round-trips text."""
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))
import torch_reference as tr  # noqa: E402  (recipe / safetensors readers, make_golden models)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rms_norm(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))


def hf_llama_logits(folder, ids):
    cfg = json.load(open(os.path.join(folder, "config.json")))
    w = {k: v.float() for k, v in tr.load_safetensors(os.path.join(folder, "model.safetensors")).items()}
    d, h, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps = d // h, cfg["rms_norm_eps"]
    b, t = ids.shape
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = torch.outer(torch.arange(t).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()                                  # [t, hd]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    x = w["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (a @ w[p + "self_attn.q_proj.weight"].T).view(b, t, h, hd).transpose(1, 2)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).view(b, t, kv, hd).transpose(1, 2)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(b, t, kv, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(~causal, float("-inf")).softmax(-1)
        o = (s @ v).transpose(1, 2).reshape(b, t, d)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        m = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def mllm_logits(checkpoint, ids):
    folder = tr.checkpoint_folder(checkpoint)
    r = tr.read_recipe(os.path.join(folder, "recipe.yaml"))
    weights = tr.load_safetensors(os.path.join(folder, "model.safetensors"))
    vocab = weights["tok_emb.weight"].shape[0]
    model = tr.build_model(r, vocab, int(r["data.seq_len"]))
    model.load_state_dict({k: weights[k] for k in model.state_dict()})
    return model.eval()(ids).float()


def main():
    if len(sys.argv) < 4 or sys.argv[1] != "compare":
        sys.exit(__doc__)
    folder, checkpoint = sys.argv[2], sys.argv[3]
    atol = float(sys.argv[sys.argv.index("--atol") + 1]) if "--atol" in sys.argv else 1e-5
    cfg = json.load(open(os.path.join(folder, "config.json")))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, cfg["vocab_size"], (3, min(24, cfg["max_position_embeddings"])), generator=gen)
    ids[:, 0] = cfg["bos_token_id"]
    with torch.no_grad():
        ours = mllm_logits(checkpoint, ids)
        theirs = hf_llama_logits(folder, ids)
        diff = (ours - theirs).abs().max().item()
        print(json.dumps({"max_abs_diff": diff, "logit_scale": ours.abs().max().item()}))
        failed = diff > atol
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("transformers is not installed: AutoModelForCausalLM not checked")
        else:
            from transformers import AutoModelForCausalLM
            hf = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
            d2 = (hf(ids).logits.float() - ours).abs().max().item()
            print(json.dumps({"transformers_max_abs_diff": d2}))
            from transformers import AutoTokenizer
            tok = AutoTokenizer.from_pretrained(folder)
            if os.path.exists(os.path.join(folder, "tokenizer.json")):  # the char tokenizer
                vocab = json.load(open(os.path.join(folder, "tokenizer.json")))["model"]["vocab"]
                chars = [c for c, i in sorted(vocab.items(), key=lambda kv: kv[1]) if i >= 4][:12]
                text = "".join(chars) + "\n" + "".join(reversed(chars))
                want = [cfg["bos_token_id"]] + [vocab.get(c, 1) for c in text]
                ids_t = tok(text)["input_ids"]
                back = tok.decode(ids_t, skip_special_tokens=True)
                ok = ids_t == want and back == text
                print(json.dumps({"tokenizer": type(tok).__name__, "ids_as_mllm": ids_t == want,
                                  "round_trip": back == text}))
                failed = failed or not ok
            failed = failed or d2 > max(1e-4, atol)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
