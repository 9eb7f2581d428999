#!/usr/bin/env python3
"""Independent reader of an mllm token shard (docs/data.md): prints header fields and the unigram
entropy of its tokens in nats/token (the loss of the best context-free model, a baseline for
training curves). Usage: shard_stats.py SHARD [--no-specials]"""
import math
import struct
import sys
from collections import Counter
from array import array

def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    data = open(sys.argv[1], "rb").read()
    magic, version, tbytes, n, docs, vocab, fp, _hh, _res = struct.unpack_from("<8sIIQQQQQQ", data, 0)
    assert magic == b"MLLMTOKS" and version == 1, "not an mllm shard v1"
    toks = array("H" if tbytes == 2 else "I")
    toks.frombytes(data[64:64 + n * tbytes])
    counts = Counter(toks)
    if "--no-specials" in sys.argv[2:]:
        for s in (0, 1, 2, 3):
            counts.pop(s, None)
    total = sum(counts.values())
    h = -sum(c / total * math.log(c / total) for c in counts.values())
    print(f"tokens {n}  documents {docs}  vocab {vocab}  token_bytes {tbytes}  fingerprint {fp:016x}")
    print(f"distinct ids used {len(counts)}  counted tokens {total}")
    print(f"unigram entropy {h:.4f} nats/token ({h / math.log(2):.4f} bits), perplexity {math.exp(h):.1f}")

if __name__ == "__main__":
    main()
