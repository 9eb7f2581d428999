#!/usr/bin/env bash
# launch/sweep.sh on the tiny recipe, 2 points x 6 steps: an interrupted sweep (stop at step 4)
# reports partial points and exit 1; the same command resumes them from their checkpoints; the
# table equals values recomputed here from metrics.jsonl, invocations.tsv and the MiniLLM
# parameter formula; the PNGs exist; a rerun trains nothing; another experiment in the same
# folder is refused (exit 2).
source "$(dirname "$0")/../e2e/common.sh"
S="$MLLM_SOURCE_DIR/launch/sweep.sh"
OUT="$WORK/sweep"
cd "$MLLM_SOURCE_DIR"
ARGS=("$RECIPE" "model.n_heads=1,2" train.max_steps=6 "data.cache_dir=$CACHE" "data.corpus=[$CORPUS]"
      checkpoint.every_steps=0 eval.every_steps=3 log.every_steps=1 --out "$OUT" --parallel 2)

set +e; "$S" "${ARGS[@]}" train.stop_at_step=4 > "$WORK/out1" 2> "$WORK/err1"; code=$?; set -e
[ "$code" -eq 1 ] || { cat "$WORK/err1" >&2; fail "stopped sweep exited $code, want 1"; }
for h in 1 2; do
  grep -q "^model.n_heads=$h,$h,.*,partial (4/6)$" "$OUT/results.csv" || fail "point $h not partial: $(cat "$OUT/results.csv")"
done

# As if the stopped invocation had logged steps beyond its checkpoint before it died: the resumed
# run logs them again, and the table must take the later lines.
echo '{"step":6,"loss":99.0,"tokens_per_s":1.0}' >> "$OUT/model.n_heads=1/metrics.jsonl"
echo '{"step":6,"val_loss":99.0,"val_ppl":1.0}' >> "$OUT/model.n_heads=1/metrics.jsonl"
"$S" "${ARGS[@]}" > "$WORK/out2" 2> "$WORK/err2" || { cat "$WORK/err2" >&2; fail "resumed sweep"; }
for h in 1 2; do
  grep -q "resumed from .*model.n_heads=$h/checkpoints/step_000004 at step 4" "$OUT/model.n_heads=$h/sweep.log" \
    || fail "point $h did not resume from step 4"
done

# The table, recomputed independently (a step logged twice counts with its last line).
python3 - "$OUT" "$(ls "$CACHE"/*/tokenizer.mllm | head -1)" <<'PY' || fail "results differ from the run folders"
import csv, json, statistics, sys
out, tok = sys.argv[1], sys.argv[2]
V = json.loads(open(tok, "rb").readline())["vocab_size"]
d, S, L, dff = 32, 32, 1, 64                  # tests/assets/tiny.yaml
params = V * d + S * d + L * (4 * (d * d + d) + 2 * d * dff + dff + d + 4 * d) + V * d + V
rows = list(csv.DictReader(open(f"{out}/results.csv")))
assert [r["point"] for r in rows] == ["model.n_heads=1", "model.n_heads=2"], rows
for r, h in zip(rows, ("1", "2")):
    folder = f"{out}/{r['point']}"
    train, val = {}, {}
    for line in open(f"{folder}/metrics.jsonl"):
        o = json.loads(line)
        (val if "val_loss" in o else train)[o["step"]] = o   # a redone step keeps its last line
    assert sorted(train) == [1, 2, 3, 4, 5, 6] and sorted(val) == [3, 6], (sorted(train), sorted(val))
    assert train[6]["loss"] != 99.0 and val[6]["val_loss"] != 99.0
    inv = [l.split() for l in open(f"{folder}/invocations.tsv")]
    assert len(inv) == 2 and all(x[2] == "0" for x in inv), inv
    want = {"model.n_heads": h, "params": str(params), "steps": "6",
            "final_train_loss": f"{train[6]['loss']:.6f}", "final_val_loss": f"{val[6]['val_loss']:.6f}",
            "tokens_per_s": f"{statistics.median(o['tokens_per_s'] for o in train.values()):.1f}",
            "wall_s": f"{sum(float(x[1]) - float(x[0]) for x in inv):.1f}", "status": "done"}
    for k, v in want.items():
        assert r[k] == v, (r["point"], k, r[k], v)
    md = open(f"{out}/results.md").read()
    assert f"| {h} | {params:,} | 6 | {train[6]['loss']:.4f} | {val[6]['val_loss']:.4f} |" in md, md
print("table ok")
PY
if command -v gnuplot > /dev/null; then
  for png in val_loss final_val_loss plots/loss plots/lr plots/throughput; do
    [ "$(head -c 8 "$OUT/$png.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "$png.png is not a PNG"
  done
  # 2 val curves, 2 curves of val minus the mean, 1 final-loss line.
  [ "$(grep -c "with linespoints" "$OUT/plots.gp")" -eq 5 ] || fail "plots.gp: $(grep -c "with linespoints" "$OUT/plots.gp") curves with points, want 5"
fi

# Rerun: nothing trains, nothing in the point folders changes.
sums() { md5sum "$OUT"/*/metrics.jsonl "$OUT"/*/invocations.tsv "$OUT"/*/checkpoints/latest; }
before=$(sums)
"$S" "${ARGS[@]}" > "$WORK/out3" 2> "$WORK/err3" || { cat "$WORK/err3" >&2; fail "rerun"; }
[ "$(grep -c "skip model.n_heads=[12] (done)" "$WORK/err3")" -eq 2 ] || fail "rerun did not skip: $(cat "$WORK/err3")"
! grep -q ": train\|: resume" "$WORK/err3" || fail "rerun trained: $(cat "$WORK/err3")"
[ "$(sums)" = "$before" ] || fail "rerun changed the point folders"

# Another experiment in the same sweep folder: refused, nothing trains.
set +e; "$S" "${ARGS[@]/train.max_steps=6/train.max_steps=8}" > /dev/null 2> "$WORK/err4"; code=$?; set -e
[ "$code" -eq 2 ] || fail "changed max_steps into the same folder exited $code, want 2"
grep -q "was made from another recipe" "$WORK/err4" || fail "no message: $(cat "$WORK/err4")"
[ "$(sums)" = "$before" ] || fail "a refused sweep changed the point folders"
echo PASS
