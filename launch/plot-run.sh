#!/usr/bin/env bash
# launch/plot-run.sh RUN [RUN...]: charts of training runs from their metrics.jsonl, written to
# RUN/plots/ of the first run: loss.png (train and val loss against tokens), lr.png and
# throughput.png (tokens/s and MFU), all runs on the same charts. Needs python3 and gnuplot
# (launch/install-deps.sh installs gnuplot-nox).   GNUPLOT=gnuplot (program)
set -euo pipefail
usage() { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  "") usage >&2; exit 2 ;;
esac
exec python3 "$(dirname "$0")/run_plots.py" --gnuplot "${GNUPLOT:-gnuplot}" --out "$1/plots" "$@"
