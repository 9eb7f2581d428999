#!/usr/bin/env bash
# Preparation streams: a corpus 3x the memory budget is prepared inside a memory cgroup whose
# hard limit is the budget (data.prepare_memory_mb), without being killed, and the cgroup's
# peak usage is reported. Needs root and a writable memory cgroup (v1 or v2); else skipped
# (exit 77) with the reason.
source "$(dirname "$0")/common.sh"
BUDGET_MB=${MLLM_MEMORY_TEST_MB:-400}

[ "$(id -u)" -eq 0 ] || { echo "prepare_memory: skipped: needs root for a memory cgroup"; exit 77; }
CG=""
if [ -w /sys/fs/cgroup/memory ] && mkdir "/sys/fs/cgroup/memory/mllm_prepare_$$" 2>/dev/null; then
  CG=/sys/fs/cgroup/memory/mllm_prepare_$$
  echo $((BUDGET_MB << 20)) > "$CG/memory.limit_in_bytes"
  [ -e "$CG/memory.memsw.limit_in_bytes" ] && echo $((BUDGET_MB << 20)) > "$CG/memory.memsw.limit_in_bytes"
  PEAK=$CG/memory.max_usage_in_bytes
elif [ -w /sys/fs/cgroup/cgroup.subtree_control ] && mkdir "/sys/fs/cgroup/mllm_prepare_$$" 2>/dev/null; then
  CG=/sys/fs/cgroup/mllm_prepare_$$
  echo $((BUDGET_MB << 20)) > "$CG/memory.max" || { rmdir "$CG"; echo "prepare_memory: skipped: no memory controller in the cgroup v2 tree"; exit 77; }
  [ -e "$CG/memory.swap.max" ] && echo 0 > "$CG/memory.swap.max"
  PEAK=$CG/memory.peak
else
  echo "prepare_memory: skipped: no writable memory cgroup (v1 /sys/fs/cgroup/memory or v2)"
  exit 77
fi
trap 'rmdir "$CG" 2>/dev/null; cleanup' EXIT

python3 "$MLLM_SOURCE_DIR/bench/make_corpus.py" "$WORK/corpus" --bytes $((BUDGET_MB * 3 * 1048576)) \
  --files 6 --formats jsonl,txt --source "$CORPUS" > /dev/null || fail "make_corpus"
size_mb=$(du -sm --apparent-size "$WORK/corpus" | cut -f1)

set +e
( echo $BASHPID > "$CG/cgroup.procs"
  exec "$MLLM_BIN/mllm-prepare" "$RECIPE" "data.corpus=[$WORK/corpus/*]" "data.cache_dir=$WORK/cache" \
    data.prepare_memory_mb=$BUDGET_MB -j 2 ) > "$WORK/log" 2>&1
code=$?
set -e
peak_mb=$(( $(cat "$PEAK" 2>/dev/null || echo 0) >> 20 ))
[ "$code" -eq 0 ] || { cat "$WORK/log"; fail "mllm-prepare under a $BUDGET_MB MiB limit: exit $code (137 = killed for memory)"; }
grep -q "wrote " "$WORK/log" || { cat "$WORK/log"; fail "no output line"; }
ls "$WORK"/cache/*/manifest.json > /dev/null || fail "no manifest"
echo "prepare_memory: $size_mb MB of corpus (3 x the budget) prepared under a $BUDGET_MB MiB cgroup limit; peak cgroup usage $peak_mb MiB (page cache included); $(grep -o 'peak RSS [^;)]*' "$WORK/log")"
