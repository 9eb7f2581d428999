#!/usr/bin/env bash
# launch/plot-run.sh: PNGs in the first run's plots/ folder, both runs on the charts, val points
# placed at the tokens of their step (interpolated between logged steps), the last line of a
# step winning after a resume; clear errors for a folder without metrics.jsonl.
set -euo pipefail
: "${MLLM_SOURCE_DIR:?set by ctest}"
WORK=$(mktemp -d /tmp/mllm_plot.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
P="$MLLM_SOURCE_DIR/launch/plot-run.sh"
mkdir -p "$WORK/a" "$WORK/b"
# Run a: 100 tokens per step, logged every 2 steps; val at step 3 (between logged steps 2 and 4:
# 300 tokens) and 4; step 4 logged twice (a resume), the second line wins; a skipped update and
# a resume event are not train points.
cat > "$WORK/a/metrics.jsonl" <<'J'
{"step":2,"tokens":200,"loss":5.0,"lr":1e-4,"tokens_per_s":1000,"mfu":0.25}
{"val_loss":4.9,"step":3,"val_ppl":134.3}
{"step":4,"tokens":400,"loss":9.9,"lr":2e-4,"tokens_per_s":1100,"mfu":0.3}
{"event":"resume","step":2}
{"step":4,"tokens":400,"loss":4.5,"lr":2e-4,"tokens_per_s":1200,"mfu":0.3}
{"step":5,"tokens":500,"skipped":true,"grad_norm":1e9,"lr":2e-4}
{"step":4,"val_loss":4.4,"val_ppl":81.5}
J
printf '%s\n' '{"step":1,"tokens":50,"loss":6.0,"lr":1e-4,"tokens_per_s":900,"mfu":0.2}' > "$WORK/b/metrics.jsonl"
GNUPLOT="${GNUPLOT:-gnuplot}"
if ! command -v "$GNUPLOT" > /dev/null; then echo "SKIP: no gnuplot"; exit 77; fi
"$P" "$WORK/a" "$WORK/b" > "$WORK/out" 2>&1 || { cat "$WORK/out"; fail "plot-run.sh"; }
for png in loss lr throughput; do
  [ "$(head -c 8 "$WORK/a/plots/$png.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
    fail "$png.png is not a PNG"
done
python3 - "$WORK/a/plots/runs.dat" <<'PY' || fail "runs.dat"
import sys
blocks = [b.strip().splitlines() for b in open(sys.argv[1]).read().split("\n\n\n") if b.strip()]
rows = lambda b: [tuple(float(x) for x in l.split()) for l in b[1:]]
assert blocks[0][0] == "# a: step tokens loss lr tokens_per_s mfu%", blocks[0][0]
assert rows(blocks[0]) == [(2, 200, 5.0, 1e-4, 1000, 25.0), (4, 400, 4.5, 2e-4, 1200, 30.0)], rows(blocks[0])
assert rows(blocks[1]) == [(3, 300, 4.9), (4, 400, 4.4)], rows(blocks[1])
assert blocks[2][0].startswith("# b:") and rows(blocks[2]) == [(1, 50, 6.0, 1e-4, 900, 20.0)]
print("runs.dat ok")
PY
[ "$(grep -c "title 'a train'" "$WORK/a/plots/plots.gp")" -eq 1 ] || fail "run a not on the loss chart"
[ "$(grep -c "title 'b'" "$WORK/a/plots/plots.gp")" -eq 3 ] || fail "run b not on the lr / throughput charts"
set +e
"$P" "$WORK/nothing" > "$WORK/out" 2>&1
code=$?
set -e
[ "$code" -ne 0 ] && grep -q "metrics.jsonl: no such file" "$WORK/out" || { cat "$WORK/out"; fail "missing run folder"; }
echo PASS
