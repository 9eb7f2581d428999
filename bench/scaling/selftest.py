#!/usr/bin/env python3
"""Checks of bench/scaling/scaling_model.py that need no measurement, MPI or gnuplot (a few seconds):

1. the fit recovers known alpha, beta, t0 from synthetic all-reduce times (each time-sharing
   variant, exact and with 5% multiplicative noise), and held-out errors are small;
2. the variant selection picks the variant the data was generated with;
3. bucket planning matches framework/mllm/distributed/bucket_plan.cpp's rules;
4. parameter counts and FLOPs per token match mllm-train's log (mini) and the published shapes;
5. the GPU all-reduce model reproduces the published curves it is checked against.

   python3 bench/scaling/selftest.py        exit 0 when every check passes, 1 otherwise
"""
import json
import math
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaling_model as sm  # noqa: E402

FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILURES.append(what)


def synthetic(share, truth, cores, noise, seed):
    rng = random.Random(seed)
    reps = {}
    for p in range(2, 9):
        for k in range(15):
            n = 4096 << k
            t = sm.predict(share, truth, n, p, cores)
            reps[(p, n)] = [t * math.exp(rng.gauss(0, noise)) for _ in range(5)]
    return reps


def main():
    cores = 2
    truth = {"small": [12e-6, 10e-6, 0.25e-9], "large": [20e-6, 6e-6, 0.35e-9]}
    for share in sm.SHARES:
        res = sm.cpu_fit(synthetic(share, truth, cores, 0.0, 1), cores)
        fitted = sm.fit(share, res["points"], cores)
        worst = max(abs(f - t) / t for reg in truth for f, t in zip(fitted[reg], truth[reg]))
        check(worst < 1e-6, f"exact data, {share}: parameters recovered (worst relative error {worst:.1e})")
        check(res["chosen"] == share, f"exact data, {share}: variant selection picks it")
        noisy = sm.cpu_fit(synthetic(share, truth, cores, 0.05, 2), cores)
        a = noisy["results"][share]["A"]["test"]
        b = noisy["results"][share]["B"]["test"]
        check(a["median"] < 0.06 and b["median"] < 0.06,
              f"5% noise, {share}: held-out median error {a['median']:.1%} (np), {b['median']:.1%} (sizes)")
        fitted = noisy["results"][share]["A"]["coef"]
        beta_err = abs(fitted["large"][2] - truth["large"][2]) / truth["large"][2]
        check(beta_err < 0.05, f"5% noise, {share}: large-message beta within 5% ({beta_err:.1%})")

    # Bucket planning: reverse registration order, close before passing the cap, big tensors alone.
    tensors = [("a", 10), ("b", 30), ("c", 5), ("d", 5), ("e", 100), ("f", 2)]
    sizes, names = sm.plan_buckets(tensors, cap_bytes=40 * 4)
    check(names == [["f"], ["e"], ["d", "c", "b"], ["a"]],
          f"bucket plan follows bucket_plan.cpp ({names})")
    check(sizes == [(2 + 1) * 4, (100 + 1) * 4, (40 + 3) * 4, (10 + 1) * 4], "bucket bytes carry one flag per tensor")

    shapes = sm.shapes(9694)
    check(shapes[0].params == 2764510 and shapes[0].flops_per_token == 9289524,
          "mini: 2,764,510 parameters and 9,289,524 FLOPs/token, as mllm-train logs")
    check(shapes[1].params == 124439808, "GPT-2 small: 124,439,808 parameters")
    check(shapes[2].params == 1100048384, "TinyLlama shape: 1,100,048,384 parameters")
    for sh in shapes:
        fr = sm.ready_fractions(sh)
        check(all(0 <= v <= 1 for v in fr.values()) and max(fr.values()) == 1.0,
              f"{sh.key}: every gradient has a readiness time in [0, 1] of backward")

    pub = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "published.json"), encoding="utf-8"))
    nccl = sm.Nccl(pub)
    val = sm.validate_gpu(pub, nccl)
    for key, rows in val.items():
        med = sorted(abs(r[3]) for r in rows)[len(rows) // 2]
        check(med < 0.15, f"GPU model vs {key}: median error {med:.0%} < 15%")
    check(nccl.latency("ring", 1024) > 10 * nccl.latency("tree", 1024),
          "at 1,024 GPUs the ring's latency is far above the tree's (NCCL picks trees there)")
    gpu = sm.Gpu(pub, nccl)
    r = gpu.run(shapes[2], 1024, 1, 25)
    check(0 < r["eff"] <= 1 and r["eff_serial"] <= r["eff"] + 1e-12,
          "overlapped efficiency is never below the serial bound")
    if FAILURES:
        print(f"selftest: {len(FAILURES)} check(s) failed")
        return 1
    print("selftest: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
