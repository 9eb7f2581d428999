#!/usr/bin/env python3
# Charts of one or more training runs from their metrics.jsonl (standard library + gnuplot):
# loss.png (train loss lines and val loss points against tokens), lr.png (learning rate against
# step) and throughput.png (tokens/s and MFU against step), every run on the same charts.
# Used by launch/plot-run.sh and by launch/sweep.sh (which passes its points).
#   run_plots.py --out DIR [--gnuplot PROG] RUN [RUN...]
import argparse
import json
import os
import subprocess
import sys


def _gp_str(text):
    return "'" + text.replace("'", "''") + "'"


def read_run(run):
    """{'train': [(step, tokens, loss, lr, tok/s, mfu)], 'val': [(step, tokens, val_loss)]}.
    The last line of each step wins (a resumed run logs the steps after its checkpoint again)."""
    path = os.path.join(run, "metrics.jsonl")
    if not os.path.isfile(path):
        raise SystemExit(f"plot-run: {path}: no such file (is {run} a run folder?)")
    train, val = {}, {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                o = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"plot-run: {path}:{n}: not JSON ({e.msg})")
            if "loss" in o and not o.get("skipped"):
                train[o["step"]] = (o["step"], o["tokens"], o["loss"], o["lr"],
                                    o.get("tokens_per_s", 0.0), 100.0 * o.get("mfu", 0.0))
            elif "val_loss" in o:
                val[o["step"]] = o["val_loss"]
    train = [train[s] for s in sorted(train)]
    # Tokens at a val step: from the train line of that step, else interpolated between the
    # nearest logged steps (tokens grow linearly within a run).
    points = [(0, 0)] + [(t[0], t[1]) for t in train]

    def tokens_at(step):
        for (s0, t0), (s1, t1) in zip(points, points[1:]):
            if s0 <= step <= s1:
                return t0 if s1 == s0 else t0 + (t1 - t0) * (step - s0) / (s1 - s0)
        if len(points) >= 2:  # past the last train line: extrapolate with the last rate
            (s0, t0), (s1, t1) = points[-2], points[-1]
            return t1 + (t1 - t0) / max(1, s1 - s0) * (step - s1)
        return float("nan")

    return {"train": train, "val": [(s, tokens_at(s), val[s]) for s in sorted(val)]}


def write(out, runs, labels):
    """plots.gp and runs.dat in OUT; gnuplot plots.gp (from OUT) draws the PNGs."""
    blocks = []  # (comment, rows); gnuplot addresses them with `index`

    def block(comment, rows):
        blocks.append((comment, rows))
        return len(blocks) - 1

    idx = []
    for label, r in zip(labels, runs):
        idx.append((block(f"{label}: step tokens loss lr tokens_per_s mfu%", r["train"]),
                    block(f"{label}: step tokens val_loss", r["val"])))
    with open(os.path.join(out, "runs.dat"), "w", encoding="utf-8") as f:
        for comment, rows in blocks:
            f.write(f"# {comment}\n")
            for row in rows or [("nan",) * 6]:  # gnuplot wants no empty block
                f.write(" ".join(str(x) for x in row) + "\n")
            f.write("\n\n")

    def curves(column, val_column=None):
        out_curves = []
        for i, (label, (t, v)) in enumerate(zip(labels, idx)):
            c = i % 8 + 1
            out_curves.append(f"'runs.dat' index {t} using {column} with lines lw 1.5 lc {c} "
                              f"title {_gp_str(label + (' train' if val_column else ''))}")
            if val_column:
                out_curves.append(f"'runs.dat' index {v} using {val_column} with linespoints lw 2.5 "
                                  f"pt 7 ps 1.2 lc {c} title {_gp_str(label + ' val')}")
        return "plot " + ", \\\n     ".join(out_curves)

    gp = ["# Made by launch/run_plots.py; run from this folder: gnuplot plots.gp",
          "set terminal pngcairo size 1000,620 noenhanced", "set grid", "set key outside right top",
          "set datafile missing 'nan'",
          "set output 'loss.png'", "set title 'Loss against tokens'",
          "set xlabel 'tokens'", "set ylabel 'loss (nats/token)'", "set format x '%.1s%c'",
          curves("2:3", "2:3"),
          "set output 'lr.png'", "set title 'Learning rate'", "set xlabel 'step'",
          "set ylabel 'lr'", "set format x '%g'", "set format y '%.1e'", curves("1:4"),
          "set output 'throughput.png'", "set format y '%g'", "set multiplot layout 2,1",
          "set title 'Throughput'", "set xlabel ''", "set ylabel 'tokens/s'", curves("1:5"),
          "set title ''", "set xlabel 'step'", "set ylabel 'MFU (%)'", curves("1:6"),
          "unset multiplot"]
    with open(os.path.join(out, "plots.gp"), "w", encoding="utf-8") as f:
        f.write("\n".join(gp) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="run_plots.py", description=__doc__)
    ap.add_argument("--out", required=True, help="folder for the PNGs, plots.gp and runs.dat")
    ap.add_argument("--gnuplot", default="gnuplot", help="gnuplot program")
    ap.add_argument("runs", nargs="+", help="run folders (each with metrics.jsonl)")
    a = ap.parse_args(argv)
    runs = [read_run(r) for r in a.runs]
    labels = [os.path.basename(os.path.normpath(r)) for r in a.runs]
    seen = {}
    for i, l in enumerate(labels):  # same folder names in different places: number them
        seen[l] = seen.get(l, 0) + 1
        if seen[l] > 1:
            labels[i] = f"{l} ({seen[l]})"
    os.makedirs(a.out, exist_ok=True)
    write(a.out, runs, labels)
    try:
        subprocess.run([a.gnuplot, "plots.gp"], cwd=a.out, check=True)
    except FileNotFoundError:
        raise SystemExit(f"plot-run: no gnuplot ({a.gnuplot}); launch/install-deps.sh installs "
                         f"gnuplot-nox. The data and script are in {a.out}")
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"plot-run: gnuplot failed (exit {e.returncode}) on {a.out}/plots.gp")
    print(f"plot-run: {a.out}/loss.png, lr.png, throughput.png")


if __name__ == "__main__":
    sys.exit(main())
