#!/usr/bin/env python3
# The parts of launch/sweep.sh that are easier in Python (standard library only): the option
# table (parser and --help), grid parsing and expansion, the plan (one folder per point, its
# overrides and resolved recipe recorded), the state of each point, and result collection
# (markdown + CSV table; the gnuplot script and data come from sweep_plots.py).
#
#   sweep_lib.py usage                   sweep.sh --help
#   sweep_lib.py plan ARGS...            parse sweep.sh's arguments, validate every point, write
#                                        the plan (not with --dry-run); print it as shell code
#   sweep_lib.py collect SWEEP_DIR       results.md, results.csv, plots.gp (+ .dat); prints the
#                                        markdown table; exit 3 when a point is not done
# Exit codes: 0 fine, 2 bad input (options, grid syntax, recipe, a point folder from another
# recipe), 1 anything else.
import csv
import difflib
import hashlib
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import textwrap

from sweep_plots import write_plots  # launch/, next to this file

PROG = "launch/sweep.sh"


class UsageError(Exception):
    """Bad input on the command line or in the sweep folder: exit 2."""


# --------------------------------------------------------------------------- option table
# One table drives both the parser and --help: (flag, metavar, default, help, converter).
def _positive_int(flag):
    def convert(text):
        if not re.fullmatch(r"[1-9][0-9]*", text):
            raise UsageError(f"{flag} needs a positive integer, got '{text}'")
        return int(text)
    return convert


def _count(flag):
    def convert(text):
        if not re.fullmatch(r"[0-9]+", text):
            raise UsageError(f"{flag} needs a whole number >= 0, got '{text}'")
        return int(text)
    return convert


def _threads(text):
    return "auto" if text == "auto" else _positive_int("--threads")(text)


OPTIONS = [
    ("--np", "N", 1, "ranks per point; N > 1 runs through launch/mpirun.sh", _positive_int("--np")),
    ("--parallel", "SLOTS", 1, "points trained at the same time", _positive_int("--parallel")),
    ("--threads", "T", "auto", "train.threads per rank; auto = cores / (N x SLOTS), at least 1 "
     "(a train.threads in the grid wins)", _threads),
    ("--eval-points", "K", 10, "evaluations per point at least, so that val_loss.png shows "
     "curves: a point whose recipe evaluates less often gets eval.every_steps=max_steps/K "
     "(recorded with its overrides; evaluation does not change training). 0 = the recipe's; an "
     "eval.every_steps in the grid wins", _count("--eval-points")),
    ("--out", "DIR", None, "sweep folder (default runs/sweeps/<recipe>__<grid>); one subfolder "
     "per point", str),
    ("--dry-run", None, False, "validate the grid and every point's recipe, print the commands, "
     "train nothing, write nothing", None),
    ("-h, --help", None, False, "this help", None),
]

ENVIRONMENT = [
    ("MLLM_BIN", "folder with mllm-train and mllm-prepare (default <repo>/build/bin)"),
    ("GNUPLOT", "gnuplot program (default gnuplot; plots are skipped with a warning if missing)"),
    ("PYTHON", "Python 3 interpreter for this helper (default python3)"),
]


def usage():
    lines = [
        f"Usage: {PROG} RECIPE GRID... [options]",
        "",
        "Trains one run per point of the grid (the cartesian product of the GRID value lists),",
        "each in its own folder of the sweep folder, then writes results.md and results.csv (the",
        "point's overrides, parameters, steps, final train and val loss, median tokens/s, wall",
        "time) and two gnuplot PNGs: val_loss.png (val loss of every point against step, with",
        "its train loss as a thin line) and final_val_loss.png (final val loss against the first",
        "swept key, one line per value of the others).",
        "",
        "GRID is key.path=v1,v2,... (recipe key paths and values as in mllm-train overrides).",
        "Commas inside [...], {...} or quotes do not split: optim.betas=[0.9,0.95],[0.9,0.99].",
        "A key with one value applies to every point. Keys with several values name the point",
        "folders, e.g. model.n_heads=4. run.out_dir is set by the sweep. Swept data.* keys",
        "(but mode and seq_len) give each point data.cache_dir=<cache_dir>/sweep-<values>, unless",
        "the grid sets data.cache_dir.",
        "",
        "Resumable: run the same command again. Finished points (checkpoints/latest at",
        "train.max_steps) are skipped; interrupted ones resume from their own checkpoints",
        "(checkpoint.resume: auto). Ctrl-C or SIGTERM stops every running point with a",
        "checkpoint. A point folder made from a different resolved recipe is refused (exit 2).",
        "",
        "Options:",
    ]
    for flag, metavar, default, help_text, _ in OPTIONS:
        head = flag + (f" {metavar}" if metavar else "")
        tail = f" (default {default})" if metavar and default is not None else ""
        lines += textwrap.wrap(f"{help_text}{tail}", 96, initial_indent=f"  {head:<16} ",
                               subsequent_indent=" " * 19)
    lines += ["", "Environment:"]
    lines += [f"  {name:<16} {text}" for name, text in ENVIRONMENT]
    lines += ["", "Exit codes: 0 every point done; 1 a point failed or is not finished; 2 bad input",
              "(options, grid syntax, recipe or override, a foreign point folder); 130 stopped by",
              "Ctrl-C or SIGTERM (the running points checkpointed).",
              "", "Example:", f"  {PROG} recipes/mini.yaml model.n_heads=1,2,4,8 train.max_steps=200 "
              "--parallel 2"]
    return "\n".join(lines) + "\n"


def parse_args(argv):
    """sweep.sh's arguments -> (recipe, [(key, [values])], options dict). Raises UsageError."""
    opts = {flag.split(", ")[-1].lstrip("-").replace("-", "_"): default
            for flag, _, default, _, _ in OPTIONS}
    by_flag = {}
    for flag, metavar, _, _, convert in OPTIONS:
        for name in flag.split(", "):
            by_flag[name] = (flag.split(", ")[-1].lstrip("-").replace("-", "_"), metavar, convert)
    positional = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-"):
            name, _, inline = arg.partition("=")
            if name not in by_flag:
                raise UsageError(f"unknown option '{arg}' (see {PROG} --help)")
            dest, metavar, convert = by_flag[name]
            if metavar is None:
                if inline:
                    raise UsageError(f"{name} takes no value")
                opts[dest] = True
            else:
                if not inline:
                    i += 1
                    if i >= len(argv):
                        raise UsageError(f"{name} needs a value {metavar}")
                    inline = argv[i]
                opts[dest] = convert(inline)
        else:
            positional.append(arg)
        i += 1
    if opts["help"]:
        return None, [], opts
    if not positional:
        raise UsageError(f"no recipe given; usage: {PROG} RECIPE GRID... (see --help)")
    recipe, grid_args = positional[0], positional[1:]
    if "=" in recipe or not recipe.endswith((".yaml", ".yml")):
        raise UsageError(f"the first argument must be a recipe .yaml file, got '{recipe}'")
    return recipe, parse_grid(grid_args), opts


# --------------------------------------------------------------------------- grid
KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
NO_CACHE_EFFECT = {"data.mode", "data.seq_len", "data.cache_dir"}
RESERVED = {"run.out_dir": "the sweep gives every point its own run.out_dir (use --out)"}


def split_values(text):
    """'1,[2,3],"a,b"' -> ['1', '[2,3]', '"a,b"']: commas split only outside brackets and
    quotes. Raises ValueError on unbalanced brackets, open quotes or an empty value."""
    values, depth, quote, start = [], [], None, 0
    pairs = {"]": "[", "}": "{"}
    for pos, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth.append(ch)
        elif ch in "]}":
            if not depth or depth.pop() != pairs[ch]:
                raise ValueError(f"unmatched '{ch}' at character {pos + 1}")
        elif ch == "," and not depth:
            values.append(text[start:pos])
            start = pos + 1
    if quote:
        raise ValueError(f"unterminated {quote} quote")
    if depth:
        raise ValueError(f"unclosed '{depth[-1]}'")
    values.append(text[start:])
    for n, v in enumerate(values):
        if not v.strip():
            raise ValueError(f"value {n + 1} of {len(values)} is empty (stray comma?)")
    return values


def parse_grid(args):
    """['model.n_heads=1,2', 'train.max_steps=50'] -> [('model.n_heads', ['1', '2']), ...].
    Raises UsageError naming the argument for anything malformed."""
    grid, seen = [], set()
    for arg in args:
        key, eq, rest = arg.partition("=")
        where = f"grid argument '{arg}'"
        if not eq:
            raise UsageError(f"{where}: expected key.path=v1,v2,... (no '=')")
        if not KEY_RE.fullmatch(key):
            raise UsageError(f"{where}: '{key}' is not a key path like model.n_heads")
        if key in RESERVED:
            raise UsageError(f"{where}: {RESERVED[key]}")
        if key in seen:
            raise UsageError(f"{where}: {key} is given twice; list all its values once: {key}=a,b")
        try:
            values = split_values(rest)
        except ValueError as e:
            raise UsageError(f"{where}: {e}") from None
        dup = sorted({v for v in values if values.count(v) > 1})
        if dup:
            raise UsageError(f"{where}: value {dup[0]} is listed twice")
        seen.add(key)
        grid.append((key, values))
    return grid


def expand(grid):
    """Cartesian product, the first key varying slowest: list of [(key, value), ...]."""
    points = [[]]
    for key, values in grid:
        points = [p + [(key, v)] for p in points for v in values]
    return points


def swept_keys(grid):
    return [k for k, values in grid if len(values) > 1]


def _safe(text):
    return re.sub(r"[^A-Za-z0-9._+=-]", "_", text)


def point_name(point, swept):
    """Folder name of a point: its swept key=value pairs joined by ',' ('base' if none)."""
    parts = [f"{k}={_safe(v)}" for k, v in point if k in swept]
    name = ",".join(parts) or "base"
    if len(name) > 200:  # file names stop at 255 bytes
        name = name[:180] + "~" + hashlib.sha1(name.encode()).hexdigest()[:12]
    return name


def default_out(recipe, grid):
    stem = os.path.splitext(os.path.basename(recipe))[0]
    spec = "__".join(f"{k}={','.join(v)}" for k, v in grid)
    name = _safe(f"{stem}__{spec}" if spec else stem)
    if len(name) > 200:
        name = name[:180] + "~" + hashlib.sha1(name.encode()).hexdigest()[:12]
    return os.path.join("runs", "sweeps", name)


# --------------------------------------------------------------------------- recipes
def yaml_scalar(text, section, key):
    """The value of `section: {key: ...}` / `section:\n  key: ...` in a resolved recipe as printed
    by mllm-train --print-recipe (block style, two-space indent); None if absent."""
    inside = False
    for line in text.splitlines():
        if re.match(r"^\S", line):
            inside = line.split(":")[0].strip() == section
            m = re.match(rf"^{section}:\s*\{{(.*)\}}\s*$", line)
            if m:
                for part in m.group(1).split(","):
                    k, _, v = part.partition(":")
                    if k.strip() == key:
                        return v.strip()
        elif inside:
            m = re.match(rf"^\s+{key}:\s*(.*?)\s*$", line)
            if m:
                return m.group(1)
    return None


def resolve_recipe(bin_dir, recipe, overrides):
    """mllm-train RECIPE OVERRIDES --print-recipe -> resolved YAML; UsageError on exit 2."""
    exe = os.path.join(bin_dir, "mllm-train")
    if not os.access(exe, os.X_OK):
        raise RuntimeError(f"{exe} not found; build it (cmake -S . -B build && make -C build "
                           "mllm-train) or set MLLM_BIN")
    proc = subprocess.run([exe, recipe, *overrides, "--print-recipe"], capture_output=True,
                          text=True)
    if proc.returncode == 2:
        raise UsageError(proc.stderr.strip() or proc.stdout.strip())
    if proc.returncode != 0:
        raise RuntimeError(f"mllm-train --print-recipe failed ({proc.returncode}): "
                           f"{proc.stderr.strip()}")
    return proc.stdout


# Keys that control one invocation, not the experiment: they may change between resumes.
RUN_CONTROL = {"train.stop_at_step", "train.time_limit_s", "train.threads", "log.level"}


def experiment(resolved):
    """A resolved recipe (block YAML, two-space indent, as --print-recipe writes it) as
    'key.path: value' lines, without RUN_CONTROL keys; list items appear as 'key.path[]: item'."""
    out, path = [], []
    for line in resolved.splitlines():
        text = line.strip()
        if not text:
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        if text.startswith("- "):
            out.append(f"{'.'.join(path)}[]: {text[2:]}")
            continue
        key, _, value = text.partition(":")
        path = path[:depth] + [key]
        if value.strip() and ".".join(path) not in RUN_CONTROL:
            out.append(f"{'.'.join(path)}: {value.strip()}")
    return [line + "\n" for line in out]


def point_state(folder, max_steps):
    """'done' (checkpoints/latest is step_<max_steps>), 'resume' (another checkpoint) or 'new'."""
    try:
        with open(os.path.join(folder, "checkpoints", "latest")) as f:
            latest = f.read().strip()
    except OSError:
        return "new"
    return "done" if latest == f"step_{max_steps:06d}" else "resume"


def plan(argv, bin_dir):
    """Validates everything, writes the plan unless --dry-run, returns shell code for sweep.sh."""
    recipe, grid, opts = parse_args(argv)
    if opts["help"]:
        return "SWEEP_HELP=1\n"
    if not os.path.isfile(recipe):
        raise UsageError(f"recipe '{recipe}' not found")
    out = os.path.abspath(opts["out"] or default_out(recipe, grid))
    swept = swept_keys(grid)
    points = expand(grid)
    names = [point_name(p, swept) for p in points]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise UsageError(f"two points map to the same folder name '{clash[0]}'; use values that "
                         "differ in letters or digits")
    user_threads = any(k == "train.threads" for k, _ in grid)
    user_eval = any(k == "eval.every_steps" for k, _ in grid)
    # Swept keys that change the prepared data (data.mode and data.seq_len only change how the
    # shards are read): each of their values gets its own cache folder, or the points would
    # rebuild one shared cache under each other.
    data_keys = [k for k in swept if k.startswith("data.") and k not in NO_CACHE_EFFECT]
    user_cache = any(k == "data.cache_dir" for k, _ in grid)
    cores = os.cpu_count() or 1
    threads = opts["threads"]
    if threads == "auto":
        threads = max(1, cores // (opts["np"] * opts["parallel"]))
    if threads * opts["np"] * opts["parallel"] > cores:
        print(f"sweep: warning: {opts['parallel']} x {opts['np']} ranks x {threads} threads "
              f"> {cores} cores", file=sys.stderr)

    rows = []
    for point, name in zip(points, names):
        folder = os.path.join(out, name)
        overrides = [f"{k}={v}" for k, v in point]
        try:
            resolved = resolve_recipe(bin_dir, recipe, overrides + [f"run.out_dir={folder}"])
            max_steps = int(yaml_scalar(resolved, "train", "max_steps"))
            data_part = ",".join(f"{k}={_safe(v)}" for k, v in point if k in data_keys)
            if data_part and not user_cache:
                cache = yaml_scalar(resolved, "data", "cache_dir")
                overrides.append(f"data.cache_dir={cache}/sweep-{data_part}")
            every = max(1, max_steps // opts["eval_points"]) if opts["eval_points"] else 0
            recipe_every = int(yaml_scalar(resolved, "eval", "every_steps"))
            if every and not user_eval and (recipe_every == 0 or recipe_every > every):
                overrides.append(f"eval.every_steps={every}")
            if len(overrides) > len(point):
                resolved = resolve_recipe(bin_dir, recipe, overrides + [f"run.out_dir={folder}"])
        except UsageError as e:
            raise UsageError(f"point {name}: mllm-train refuses its recipe:\n{e}") from None
        planned = os.path.join(folder, "recipe.planned.yaml")
        if os.path.isfile(planned):
            with open(planned) as f:
                before = f.read()
            if experiment(before) != experiment(resolved):
                diff = "".join(difflib.unified_diff(experiment(before), experiment(resolved),
                                                    "recorded", "now", n=0))
                raise UsageError(f"point folder {folder} was made from another recipe:\n{diff}"
                                 "use another --out, or delete that folder to start it again")
        state = point_state(folder, max_steps)
        rows.append((name, folder, overrides, max_steps, state, resolved))

    if not opts["dry_run"]:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "sweep.json"), "w") as f:
            json.dump({"recipe": recipe, "grid": [[k, v] for k, v in grid], "swept": swept,
                       "points": [{"name": n, "overrides": o, "max_steps": m}
                                  for n, _, o, m, _, _ in rows]}, f, indent=1)
        for name, folder, overrides, _, _, resolved in rows:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "recipe.planned.yaml"), "w") as f:
                f.write(resolved)
            with open(os.path.join(folder, "overrides.txt"), "w") as f:
                f.write("".join(o + "\n" for o in overrides))

    q = shlex.quote
    sh = [f"SWEEP_RECIPE={q(recipe)}", f"SWEEP_OUT={q(out)}", f"SWEEP_NP={opts['np']}",
          f"SWEEP_PARALLEL={opts['parallel']}", f"SWEEP_THREADS={threads}",
          f"SWEEP_USER_THREADS={int(user_threads)}", f"SWEEP_DRY_RUN={int(opts['dry_run'])}",
          f"SWEEP_POINTS=({' '.join(q(r[0]) for r in rows)})",
          f"SWEEP_STATES=({' '.join(r[4] for r in rows)})"]
    for i, row in enumerate(rows):
        sh.append(f"SWEEP_OVERRIDES_{i}=({' '.join(q(o) for o in row[2])})")
    return "\n".join(sh) + "\n"


# --------------------------------------------------------------------------- collection
def read_metrics(path):
    """metrics.jsonl -> (train {step: record}, val {step: val_loss}); a step logged twice (the
    steps after a checkpoint are redone on resume) keeps its last record."""
    train, val = {}, {}
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a kill
                if "val_loss" in rec:
                    val[rec["step"]] = rec["val_loss"]
                elif "loss" in rec:
                    train[rec["step"]] = rec
    except OSError:
        pass
    return train, val


def read_params(folder):
    """Parameter count from 'model NAME: N parameters' in logs/rank_00.log (last match)."""
    found = None
    try:
        with open(os.path.join(folder, "logs", "rank_00.log"), errors="replace") as f:
            for line in f:
                m = re.search(r"model \S+: (\d+) parameters", line)
                if m:
                    found = int(m.group(1))
    except OSError:
        pass
    return found


def read_invocations(folder):
    """invocations.tsv (start_s, end_s, exit code per training invocation) -> (wall_s, last rc)."""
    wall, rc = 0.0, None
    try:
        with open(os.path.join(folder, "invocations.tsv")) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    wall += float(parts[1]) - float(parts[0])
                    rc = int(parts[2])
    except (OSError, ValueError):
        pass
    return wall, rc


def _fmt(x, spec):
    return "" if x is None else format(x, spec)


def md_text(text):
    r"""Text for results.md, table cells in particular (GitHub-flavoured markdown): '|' becomes
    '\|' (a bare one ends the cell and shifts the row), '\' becomes '\\' (a value's own
    backslash must not escape what follows it, e.g. the '|' of 'a\|b'), and a line break <br>
    (a newline would end the row). Rendered, the cell reads as the value."""
    text = str(text).replace("\\", "\\\\").replace("|", "\\|")
    return re.sub(r"\r\n|\r|\n", "<br>", text)


def collect(out):
    with open(os.path.join(out, "sweep.json")) as f:
        sweep = json.load(f)
    swept = sweep["swept"]
    fixed = [f"{k}={v[0]}" for k, v in sweep["grid"] if k not in swept]
    results = []
    for p in sweep["points"]:
        folder = os.path.join(out, p["name"])
        train, val = read_metrics(os.path.join(folder, "metrics.jsonl"))
        wall, rc = read_invocations(folder)
        state = point_state(folder, p["max_steps"])
        last = train[max(train)] if train else None
        speeds = [r["tokens_per_s"] for r in train.values() if "tokens_per_s" in r]
        step = max(train) if train else 0
        if state == "done":
            status = "done"
        elif rc not in (None, 0):
            status = f"failed (exit {rc})"
        else:
            status = f"partial ({step}/{p['max_steps']})" if train else "not run"
        values = dict(o.split("=", 1) for o in p["overrides"])
        results.append({
            "point": p["name"], "values": [values[k] for k in swept], "overrides": p["overrides"],
            "params": read_params(folder), "steps": step, "max_steps": p["max_steps"],
            "train_loss": last["loss"] if last else None,
            "val_loss": val[max(val)] if val else None, "val_step": max(val) if val else None,
            "tokens_per_s": statistics.median(speeds) if speeds else None,
            "wall_s": wall if rc is not None else None, "status": status,
            "train_curve": sorted((s, r["loss"]) for s, r in train.items()),
            "val_curve": sorted(val.items())})

    # CSV: every number unrounded.
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["point", *swept, "overrides", "params", "steps", "final_train_loss",
                    "final_val_loss", "tokens_per_s", "wall_s", "status"])
        for r in results:
            w.writerow([r["point"], *r["values"], " ".join(r["overrides"]), r["params"] or "",
                        r["steps"], _fmt(r["train_loss"], ".6f"), _fmt(r["val_loss"], ".6f"),
                        _fmt(r["tokens_per_s"], ".1f"), _fmt(r["wall_s"], ".1f"), r["status"]])

    head = [*swept, "params", "steps", "train loss", "val loss", "tokens/s", "wall s", "status"]
    table = ["| " + " | ".join(map(md_text, head)) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [*r["values"], _fmt(r["params"], ","), str(r["steps"]),
                 _fmt(r["train_loss"], ".4f"), _fmt(r["val_loss"], ".4f"),
                 _fmt(r["tokens_per_s"], ".0f"), _fmt(r["wall_s"], ".1f"), r["status"]]
        table.append("| " + " | ".join(map(md_text, cells)) + " |")
    md = [f"# Sweep of {md_text(sweep['recipe'])}", "",
          "Swept: " + md_text(" ".join(f"{k}={','.join(v)}" for k, v in sweep["grid"] if k in swept)
                              or "nothing") + (f"; fixed: {md_text(' '.join(fixed))}" if fixed else "")
          + ". Each point's overrides are in results.csv and <point>/overrides.txt.", "",
          *table, "",
          "train loss: last logged step; val loss: last evaluation; tokens/s: median over logged "
          "steps; wall s: sum of the sweep's training invocations for the point.", "",
          "![val loss](val_loss.png)", "", "![final val loss](final_val_loss.png)", ""]
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(md))
    write_plots(out, sweep, swept, results)
    print("\n".join(table))
    return results


# --------------------------------------------------------------------------- main
def main(argv):
    if not argv or argv[0] not in ("usage", "plan", "collect"):
        print("usage: sweep_lib.py usage | plan ARGS... | collect SWEEP_DIR", file=sys.stderr)
        return 2
    cmd, args = argv[0], argv[1:]
    try:
        if cmd == "usage":
            sys.stdout.write(usage())
        elif cmd == "plan":
            bin_dir = os.environ.get("MLLM_BIN") or os.path.join(
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "bin")
            sys.stdout.write(plan(args, bin_dir))
        else:
            if len(args) != 1 or not os.path.isfile(os.path.join(args[0], "sweep.json")):
                raise UsageError("collect needs a sweep folder (one with sweep.json)")
            results = collect(args[0])
            if any(r["status"] != "done" for r in results):
                return 3
    except UsageError as e:
        print(f"sweep: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError) as e:
        print(f"sweep: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
