#!/usr/bin/env bash
# Regenerates docs/scaling.md and docs/scaling.png, the measured scaling model of issue 15:
#
#   bench/scaling/run.sh [--no-measure] [--build DIR] [--gnuplot PROG]
#
# Without --no-measure it first runs bench/scaling/measure.sh (about 5 minutes on the 2-vCPU dev
# VM; rewrites bench/scaling/data/), then fits and predicts (bench/scaling/scaling_model.py).
# With --no-measure it only refits from the committed bench/scaling/data/ and redraws the doc.
# Needs python3 (standard library) and gnuplot with the pngcairo terminal; measuring also needs
# the build (mllm_bench_allreduce, mllm_bench_overlap, mllm-train), mpirun and data/full/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MEASURE=1 BUILD_ARGS=() GNUPLOT=gnuplot
while [ $# -gt 0 ]; do
  case "$1" in
    --no-measure) MEASURE=0 ;;
    --build) [ $# -ge 2 ] || { echo "run.sh: --build needs a folder" >&2; exit 2; }; BUILD_ARGS=(--build "$2"); shift ;;
    --gnuplot) [ $# -ge 2 ] || { echo "run.sh: --gnuplot needs a program" >&2; exit 2; }; GNUPLOT="$2"; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
  shift
done
command -v "$GNUPLOT" >/dev/null || { echo "run.sh: $GNUPLOT not found (apt-get install gnuplot-nox)" >&2; exit 2; }
[ "$MEASURE" = 1 ] && "$ROOT/bench/scaling/measure.sh" "${BUILD_ARGS[@]}"
[ -f "$ROOT/bench/scaling/data/allreduce.csv" ] || { echo "run.sh: no bench/scaling/data/allreduce.csv; run without --no-measure" >&2; exit 2; }
python3 "$ROOT/bench/scaling/scaling_model.py" --gnuplot "$GNUPLOT" \
  --doc "$ROOT/docs/scaling.md" --png "$ROOT/docs/scaling.png"
