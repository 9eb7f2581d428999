#!/usr/bin/env python3
# Gnuplot script and data for launch/sweep.sh (standard library only): val_loss.png (val loss of
# every point against step, train loss as thin dashed lines) and final_val_loss.png (final val
# loss against the first swept key, one line per combination of the other swept keys).
import json
import math
import os


def _gp_str(text):
    return "'" + text.replace("'", "''") + "'"


def _number(text):
    try:
        x = float(text)
        return x if math.isfinite(x) else None
    except ValueError:
        return None


def write_plots(out, sweep, swept, results):
    """plots.gp + val_loss.dat + final_val_loss.dat; gnuplot plots.gp (from OUT) makes the PNGs."""
    # One block per curve that has data (gnuplot warns about empty blocks); curves = (index, ...).
    blocks, curves = [], []
    for i, r in enumerate(results):
        c = i % 8 + 1
        if r["val_curve"]:
            curves.append(f"'val_loss.dat' index {len(blocks)} using 1:2 with linespoints lw 2.5 "
                          f"pt 7 lc {c} title {_gp_str(r['point'])}")
            blocks.append((f"{r['point']}: step val_loss", r["val_curve"]))
        if r["train_curve"]:
            curves.append(f"'val_loss.dat' index {len(blocks)} using 1:2 with lines lw 0.8 dt 2 "
                          f"lc {c} " + ("notitle" if r["val_curve"] else
                                        f"title {_gp_str(r['point'] + ' (train)')}"))
            blocks.append((f"{r['point']}: step train_loss", r["train_curve"]))
    # Lower panel: each point's val loss minus the mean over the points at that step (steps that
    # two or more points evaluated), so curves that coincide on the loss scale come apart.
    at_step = {}
    for r in results:
        for step, v in r["val_curve"]:
            at_step.setdefault(step, []).append(v)
    mean = {step: sum(v) / len(v) for step, v in at_step.items() if len(v) >= 2}
    deltas = []
    for i, r in enumerate(results):
        rows = [(step, v - mean[step]) for step, v in r["val_curve"] if step in mean]
        if rows:
            deltas.append(f"'val_loss.dat' index {len(blocks)} using 1:2 with linespoints lw 2 pt 7 "
                          f"ps 0.8 lc {i % 8 + 1} notitle")
            blocks.append((f"{r['point']}: step val_loss-mean", rows))
    with open(os.path.join(out, "val_loss.dat"), "w") as f:
        for title, rows in blocks:
            f.write(f"# {title}\n" + "".join(f"{s} {v!r}\n" for s, v in rows) + "\n\n")
    title = f"Loss curves: {sweep['recipe']} (val: thick with points; train: thin dashed)"
    gp = ["# Made by launch/sweep_lib.py collect; run from the sweep folder: gnuplot plots.gp",
          f"set terminal pngcairo size 1000,{900 if deltas else 650} noenhanced",
          "set output 'val_loss.png'", "set grid", "set key outside right top",
          "set lmargin at screen 0.11", "set rmargin at screen 0.76"]
    if deltas:
        gp += ["set multiplot", "set origin 0,0.36", "set size 1,0.64"]
    gp += [f"set title {_gp_str(title)}", "set xlabel 'step'", "set ylabel 'loss (nats/token)'"]
    if not curves:
        curves = ["NaN notitle"]
        gp += ["set label 1 'no point has logged a loss yet' at graph 0.5, graph 0.5 center",
               "set xrange [0:1]", "set yrange [0:1]"]
    gp.append("plot " + ", \\\n     ".join(curves))
    if deltas:
        gp += ["set origin 0,0", "set size 1,0.36", "unset title",
               "set ylabel 'val loss - mean over points'",
               "plot " + ", \\\n     ".join(deltas + ["0 with lines lc 'gray' lw 1 notitle"]),
               "unset multiplot"]
    gp += ["unset lmargin", "unset rmargin", "set origin 0,0", "set size 1,1",
           "set terminal pngcairo size 1000,650 noenhanced"]

    # Final val loss against the first swept key; one line per combination of the others.
    xkey = swept[0] if swept else None
    series = {}
    for r in results:
        if r["val_loss"] is None:
            continue
        x = r["values"][0] if xkey else "base"
        rest = ",".join(f"{k}={v}" for k, v in zip(swept[1:], r["values"][1:])) or "final val loss"
        series.setdefault(rest, []).append((x, r["val_loss"]))
    xs = [x for s in series.values() for x, _ in s]
    numeric = bool(xs) and all(_number(x) is not None for x in xs)
    order = list(dict.fromkeys(v for v in (dict(sweep["grid"]).get(xkey, ["base"]))))
    with open(os.path.join(out, "final_val_loss.dat"), "w") as f:
        for name, pts in series.items():
            f.write(f"# {name}: x val_loss label\n")
            for x, v in sorted(pts, key=lambda p: _number(p[0]) if numeric else order.index(p[0])):
                xv = _number(x) if numeric else order.index(x)
                f.write(f"{xv!r} {v!r} {json.dumps(x)}\n")
            f.write("\n\n")
    gp += ["set output 'final_val_loss.png'", "unset logscale", "unset label", "set autoscale",
           f"set title {_gp_str('Final val loss against ' + (xkey or 'the single point'))}",
           f"set xlabel {_gp_str(xkey or '')}", "set ylabel 'final val loss (nats/token)'",
           "set offsets graph 0.05, graph 0.05, graph 0.1, graph 0.1"]
    if numeric:
        nums = [_number(x) for x in xs]
        if min(nums) > 0 and max(nums) / min(nums) >= 8:
            ints = all(float(n).is_integer() for n in nums)
            gp.append(f"set logscale x {2 if ints else 10}")
        gp.append("set xtics (" + ", ".join(f"{json.dumps(x)} {_number(x)!r}"
                                             for x in dict.fromkeys(xs)) + ")")
    else:
        gp.append("set xtics (" + ", ".join(f"{json.dumps(x)} {order.index(x)}"
                                             for x in dict.fromkeys(xs)) + ")")
    if series:
        gp.append("plot " + ", \\\n     ".join(
            f"'final_val_loss.dat' index {i} using 1:2 with linespoints lw 2 pt 7 ps 1.5 "
            f"title {_gp_str(name)}" for i, name in enumerate(series)))
    else:  # nothing finished yet: an empty chart that says so
        gp += ["set label 1 'no point has a val loss yet' at graph 0.5, graph 0.5 center",
               "set xrange [0:1]", "set yrange [0:1]", "plot NaN notitle"]
    with open(os.path.join(out, "plots.gp"), "w") as f:
        f.write("\n".join(gp) + "\n")
