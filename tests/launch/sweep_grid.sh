#!/usr/bin/env bash
# launch/sweep.sh grid parsing: --help comes from the parser's option table; bad grid syntax,
# bad options and keys mllm-train refuses exit 2 before anything is written; a good grid expands
# to the cartesian product (dry run: one mllm-train command per point, with its overrides); a '|',
# a backslash or a line break in a swept value stays inside its cell of results.md.
source "$(dirname "$0")/../e2e/common.sh"
S="$MLLM_SOURCE_DIR/launch/sweep.sh"
OUT="$WORK/sweep"
cd "$MLLM_SOURCE_DIR"

help=$("$S" --help) || fail "--help exit code"
# Every option of the table is in --help, and --help names no option the parser lacks.
table=$(python3 -c "
import sys; sys.path.insert(0, 'launch'); import sweep_lib
print(' '.join(n for f, *_ in sweep_lib.OPTIONS for n in f.split(', ')))")
for opt in $table; do grep -q -- "$opt" <<< "$help" || fail "--help does not mention $opt"; done
for opt in $(grep -o -- ' --[a-z-]*' <<< "$help" | sort -u); do
  grep -qw -- "$opt" <<< "$table" || fail "--help mentions $opt, which the parser does not know"
done

# expect2 ARGS...: sweep.sh exits 2 with a message and creates no sweep folder.
expect2() {
  set +e; "$S" "$@" --out "$OUT" > "$WORK/out" 2> "$WORK/err"; local code=$?; set -e
  [ "$code" -eq 2 ] || { cat "$WORK/err" >&2; fail "sweep.sh $* exited $code, want 2"; }
  [ -s "$WORK/err" ] || fail "sweep.sh $*: no message"
  [ ! -e "$OUT" ] || fail "sweep.sh $*: created $OUT"
}
expect2 "$RECIPE" model.n_heads                     # no '='
expect2 "$RECIPE" model.n_heads=                    # no value
expect2 "$RECIPE" model.n_heads=1,,2                # empty value
expect2 "$RECIPE" model.n_heads=1,2,                # trailing comma
expect2 "$RECIPE" =1,2                              # no key
expect2 "$RECIPE" 1model.x=1                        # not a key path
expect2 "$RECIPE" model..n_heads=1                  # not a key path
expect2 "$RECIPE" "optim.betas=[0.9,0.95"           # unclosed bracket
expect2 "$RECIPE" "optim.betas=[0.9,0.95]]"         # unmatched bracket
expect2 "$RECIPE" 'sample.prompts=["a,b]'           # open quote
expect2 "$RECIPE" model.n_heads=1,2 model.n_heads=4 # key twice
expect2 "$RECIPE" model.n_heads=2,2                 # value twice
expect2 "$RECIPE" run.out_dir=a,b                   # reserved
expect2 "$RECIPE" model.n_heads=1 --np 0            # bad option value
expect2 "$RECIPE" model.n_heads=1 --parallel x
expect2 "$RECIPE" model.n_heads=1 --bogus
expect2 "$RECIPE" model.n_heads=1 --np              # missing value
expect2                                             # no recipe
expect2 model.n_heads=1                             # no recipe
expect2 "$WORK/missing.yaml" model.n_heads=1        # recipe not found
expect2 "$RECIPE" model.n_head=1,2                  # mllm-train refuses the key
grep -q "did you mean model.n_heads" "$WORK/err" || fail "no suggestion from mllm-train: $(cat "$WORK/err")"
expect2 "$RECIPE" model.n_heads=1,x                 # mllm-train refuses the value

# A good grid, dry run: 3 x 2 points in order (first key slowest), brackets kept whole, fixed
# keys on every point, run.out_dir per point, threads from --threads.
"$S" "$RECIPE" model.n_heads=1,2,4 "optim.betas=[0.9,0.95],[0.8,0.9]" train.max_steps=7 \
  --out "$OUT" --threads 1 --eval-points 0 --dry-run > "$WORK/out" 2> "$WORK/err" || { cat "$WORK/err" >&2; fail "dry run"; }
[ ! -e "$OUT" ] || fail "dry run created $OUT"
expected=""
for h in 1 2 4; do
  for b in '[0.9,0.95]' '[0.8,0.9]'; do
    name="model.n_heads=$h,optim.betas=_0.9_0.95_"; [ "$b" = '[0.8,0.9]' ] && name="model.n_heads=$h,optim.betas=_0.8_0.9_"
    printf -v line '%q ' "$MLLM_BIN/mllm-train" "$RECIPE" "model.n_heads=$h" "optim.betas=$b" \
      train.max_steps=7 "run.out_dir=$OUT/$name" train.threads=1
    expected+="${line% }"$'\n'
  done
done
diff <(printf '%s' "$expected") "$WORK/out" || fail "dry-run commands differ"

# --eval-points K (default 10): eval.every_steps=max_steps/K is added (and recorded) only where
# the recipe (tiny: every 10 steps) evaluates less often and the grid does not set it.
evals() { "$S" "$RECIPE" model.n_heads=1,2 "$@" --out "$OUT" --dry-run 2>/dev/null | grep -o 'eval\.every_steps=[0-9]*' | sort | uniq -c | tr -s ' '; }
[ "$(evals train.max_steps=40)" = " 2 eval.every_steps=4" ] || fail "max_steps 40: $(evals train.max_steps=40)"
[ "$(evals train.max_steps=40 --eval-points 5)" = " 2 eval.every_steps=8" ] || fail "--eval-points 5"
[ -z "$(evals train.max_steps=100)" ] || fail "max_steps 100: every 10 is already fine"
[ -z "$(evals train.max_steps=40 --eval-points 0)" ] || fail "--eval-points 0"
[ "$(evals train.max_steps=40 eval.every_steps=20)" = " 2 eval.every_steps=20" ] || fail "the grid's eval.every_steps"
expect2 "$RECIPE" model.n_heads=1 --eval-points -1

# Swept data keys that change the prepared data get a cache folder per value; seq_len does not.
caches() { "$S" "$RECIPE" "$@" --out "$OUT" --dry-run 2>/dev/null | grep -o 'data\.cache_dir=[^ ]*' | tr '\n' ' '; }
got=$(caches data.val_fraction=0.05,0.1 train.max_steps=100)
[ "$got" = "data.cache_dir=data/cache/tiny/sweep-data.val_fraction=0.05 data.cache_dir=data/cache/tiny/sweep-data.val_fraction=0.1 " ] \
  || fail "val_fraction sweep caches: $got"
[ -z "$(caches data.seq_len=16,32 train.max_steps=100)" ] || fail "seq_len sweep got its own caches"
[ "$(caches data.val_fraction=0.05,0.1 data.cache_dir=/c train.max_steps=100)" = "data.cache_dir=/c data.cache_dir=/c " ] \
  || fail "the grid's data.cache_dir"

# --np 2 goes through mpirun.sh; --parallel 2 prepares data first, one point at a time.
"$S" "$RECIPE" model.n_heads=1,2 --out "$OUT" --np 2 --parallel 2 --dry-run > "$WORK/out" 2>/dev/null \
  || fail "dry run --np 2 --parallel 2"
[ "$(grep -c '^[^ ]*/mllm-prepare ' "$WORK/out")" -eq 2 ] || fail "no mllm-prepare lines: $(cat "$WORK/out")"
[ "$(grep -c "^[^ ]*/launch/mpirun.sh -np 2 [^ ]*/mllm-train " "$WORK/out")" -eq 2 ] \
  || fail "no mpirun.sh lines: $(cat "$WORK/out")"

# results.md: a '|', a backslash or a line break in a swept value stays in its cell (\|, \\, <br>):
# every row has the header's cells, and each reads back as the value as GitHub's tables split and
# unescape it. The plan and the table only (sweep_lib.py plan + collect, as sweep.sh runs them):
# nothing trains, so collect says the points are not run (exit 3).
MD="$WORK/md"
python3 launch/sweep_lib.py plan "$RECIPE" $'run.name=a|b,c\\d,e\\|f,g\nh,i\\' train.max_steps=2 \
  --eval-points 0 --out "$MD" > /dev/null 2> "$WORK/err" || { cat "$WORK/err" >&2; fail "plan of a run.name sweep"; }
set +e; python3 launch/sweep_lib.py collect "$MD" > /dev/null 2> "$WORK/err"; code=$?; set -e
[ "$code" -eq 3 ] || { cat "$WORK/err" >&2; fail "collect exited $code, want 3 (points not run)"; }
python3 - "$MD/results.md" <<'PY' || fail "results.md table: $(cat "$MD/results.md")"
import re, sys
def cells(row):
    r"""A GitHub table row -> its cells' text: split at '|' but not '\|', then '\|' -> '|' and
    backslash escapes (of ASCII punctuation) -> the character; <br> -> a line break."""
    assert row.startswith("| ") and row.endswith(" |"), row
    parts, cur, i, row = [], "", 0, row[1:-1]
    while i < len(row):
        if row.startswith("\\|", i):
            cur, i = cur + "\\|", i + 2
        elif row[i] == "|":
            parts, cur, i = parts + [cur], "", i + 1
        else:
            cur, i = cur + row[i], i + 1
    parts.append(cur)
    out = []
    for c in parts:
        c = re.sub(r"\\([!-/:-@[-`{-~])", r"\1", c.strip().replace("\\|", "|"))
        out.append(c.replace("<br>", "\n"))
    return out
lines = open(sys.argv[1]).read().split("\n")
top = next(i for i, l in enumerate(lines) if l.startswith("| run.name |"))
end = lines.index("", top)
head, rows = cells(lines[top]), lines[top + 2:end]
assert len(head) == 8, head
assert all(len(cells(r)) == len(head) for r in rows), rows
assert [cells(r)[0] for r in rows] == ["a|b", "c\\d", "e\\|f", "g\nh", "i\\"], rows
assert all(cells(r)[-1] == "not run" for r in rows), rows
PY

# Splitting on commas outside brackets and quotes (values written by hand).
python3 - "$MLLM_SOURCE_DIR/launch" <<'PY' || fail "split_values"
import sys; sys.path.insert(0, sys.argv[1]); from sweep_lib import split_values, expand, parse_grid
assert split_values("1,2,4") == ["1", "2", "4"]
assert split_values("[1,2],{a: 1, b: 2},'x,y',\"p,q\"") == ["[1,2]", "{a: 1, b: 2}", "'x,y'", '"p,q"']
assert split_values("[[1,2],[3]],5") == ["[[1,2],[3]]", "5"]
assert expand(parse_grid(["a.b=1,2", "c.d=x,y,z"])) == [
    [("a.b", v), ("c.d", w)] for v in ("1", "2") for w in ("x", "y", "z")]
PY
echo PASS
