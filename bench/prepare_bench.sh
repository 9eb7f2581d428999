#!/usr/bin/env bash
# Data preparation speed and memory: builds a synthetic multi-file corpus of SIZE bytes of text
# from the poetry corpora (bench/make_corpus.py: .jsonl, .jsonl.gz, .jsonl.zst, .txt and
# .parquet files), then runs mllm-prepare on it at each world size of --np, and reports per run
# the wall time, MB/s (corpus on disk and text), peak RSS per rank and whether the output is
# byte-identical to the first run's.
#
#   bench/prepare_bench.sh SIZE [--np "1 2"] [--tokenizer char|bpe] [--budget MB]
#                          [--work DIR] [--keep-corpus]
#
# SIZE: bytes of text, e.g. 1e9 or 10e9. --work (default /tmp/mllm_prepare_bench) holds
# corpus-SIZE/ (kept and reused with --keep-corpus) and one cache per run (removed after).
# Threads per rank: the cores of the machine shared by the ranks. A figure, not a test.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${MLLM_BIN:-$ROOT/build/bin}"
PY="$ROOT/.venv/bin/python3"
[ -x "$PY" ] || PY=python3

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
SIZE=$1; shift
NP="1 2" TOKENIZER=char BUDGET=1024 WORK=/tmp/mllm_prepare_bench KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --np) NP=$2; shift 2 ;;
    --tokenizer) TOKENIZER=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --keep-corpus) KEEP=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "prepare_bench.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

CORPUS="$WORK/corpus-$SIZE"
if [ ! -f "$CORPUS/.done" ]; then
  rm -rf "$CORPUS"
  mkdir -p "$WORK"
  echo "prepare_bench: writing a $SIZE-byte corpus into $CORPUS"
  t0=$(date +%s)
  "$PY" "$ROOT/bench/make_corpus.py" "$CORPUS" --bytes "$SIZE" \
    --formats jsonl,jsonl.gz,jsonl.zst,txt,parquet --parquet-row-group-rows 50000 > "$CORPUS.files"
  touch "$CORPUS/.done"
  echo "prepare_bench: corpus written in $(( $(date +%s) - t0 )) s"
fi
disk_mb=$(du -sm "$CORPUS" | cut -f1)
echo "prepare_bench: $(ls "$CORPUS" | wc -l) files, $disk_mb MB on disk; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"

first=""
for np in $NP; do
  cache="$WORK/cache-np$np"
  rm -rf "$cache"
  cmd=("$BIN/mllm-prepare" "$ROOT/recipes/mini.yaml" "data.corpus=[$CORPUS/*]" "data.cache_dir=$cache"
       data.tokenizer.type=$TOKENIZER data.prepare_memory_mb=$BUDGET)
  [ "$TOKENIZER" = bpe ] && cmd+=(data.tokenizer.vocab_size=8000)
  t0=$(date +%s.%N)
  if [ "$np" -eq 1 ]; then "${cmd[@]}" > "$WORK/log-np$np" 2>&1
  else "$ROOT/launch/mpirun.sh" -np "$np" "${cmd[@]}" > "$WORK/log-np$np" 2>&1; fi
  wall=$(echo "$(date +%s.%N) - $t0" | bc)
  line=$(grep "prepared .* MB of corpus" "$WORK/log-np$np" | sed 's/.*\] //')
  digest=$(cd "$cache"/*/ && find . -type f ! -name .prepare.lock -exec sha256sum {} + | sort -k2 | sha256sum | cut -c1-16)
  [ -z "$first" ] && first=$digest
  same=$([ "$digest" = "$first" ] && echo "identical to np $(echo $NP | cut -d' ' -f1)" || echo "DIFFERENT")
  echo "prepare_bench: np $np: wall $(printf %.1f "$wall") s ($(echo "$disk_mb / $wall" | bc) MB/s of corpus on disk) | $line | output $digest, $same"
  rm -rf "$cache"
done
[ "$KEEP" -eq 1 ] || rm -rf "$CORPUS" "$CORPUS.files"
