#!/usr/bin/env bash
# The card's command as a new user types it (issue 31, items 1 and 3): in a new shell at the
# checkout, after `source launch/env.sh` (README's first block, after command A),
# `mpirun -np 8 mllm-train recipes/mini.yaml` runs as typed — mllm-train found on PATH, mpirun
# as root, 8 ranks on fewer cores — and Ctrl-C on its terminal stops every rank with a
# checkpoint and exits 0 (plain mpirun: exit 1).
source "$(dirname "$0")/common.sh"
BUILD=$(dirname "$MLLM_BIN")
python3 - "$MLLM_SOURCE_DIR/README.md" <<'PY' || fail "README's first block"
import re, sys
block = re.search(r"```\n(.*?)```", open(sys.argv[1], encoding="utf-8").read(), re.S).group(1)
lines = [l.split("#")[0].strip() for l in block.splitlines()]
want = ["launch/quickstart.sh", "source launch/env.sh", "mpirun -np 8 mllm-train recipes/mini.yaml"]
assert lines == want, lines
PY
# A new shell: none of this environment (ctest's OpenMPI variables, MLLM_*), a login PATH.
fresh() {
  env -i HOME="$HOME" PATH=/usr/local/bin:/usr/bin:/bin TERM="${TERM:-dumb}" \
    bash --norc --noprofile -c "cd '$MLLM_SOURCE_DIR' && $1"
}
fresh 'command -v mllm-train' > /dev/null && fail "the fresh shell already finds mllm-train"
# The overrides keep it short and off the fetched corpus; the command is the card's.
SMALL="run.out_dir=$WORK/card data.cache_dir=$CACHE data.corpus=[data/tang300/tang300.jsonl] data.val_fraction=0.05"
SMALL+=" train.max_steps=3 eval.every_steps=0 sample.every_steps=0 log.every_steps=1"
fresh "MLLM_BUILD_DIR='$BUILD' && source launch/env.sh && mpirun -np 8 mllm-train recipes/mini.yaml $SMALL" \
  > "$WORK/card.log" 2>&1 || { tail -30 "$WORK/card.log"; fail "the card's command after source launch/env.sh"; }
grep -q "world size 8" "$WORK/card.log" || { tail "$WORK/card.log"; fail "not 8 ranks"; }
[ "$(cat "$WORK/card/checkpoints/latest")" = step_000003 ] || fail "no checkpoint of step 3"
# A warning about the recipe (mini's 100 warmup steps >= 3) is said once, not once per rank.
[ "$(grep -c "schedule.warmup_steps=100 >= train.max_steps=3" "$WORK/card.log")" -eq 1 ] ||
  fail "the recipe warning $(grep -c "schedule.warmup_steps=100" "$WORK/card.log") times on the console"
# Sourcing twice adds nothing to PATH; the installed layout is not needed here.
fresh "MLLM_BUILD_DIR='$BUILD'; source launch/env.sh; source launch/env.sh; echo \"\$PATH\"" > "$WORK/path"
[ "$(tr ':' '\n' < "$WORK/path" | grep -c "^$BUILD/bin\$")" -eq 1 ] || fail "PATH: $(cat "$WORK/path")"

# Ctrl-C: the byte ^C typed on mpirun's terminal (a pseudo-terminal from script(1)), once a few
# steps are logged. Every rank saves, the job exits 0.
command -v script > /dev/null || { echo "SKIP the Ctrl-C part: no script(1)"; echo "card_command: OK"; exit 0; }
mkfifo "$WORK/keys"
exec 3<> "$WORK/keys"  # held open: script(1) never sees the end of its input
LONG="run.out_dir=$WORK/stop data.cache_dir=$CACHE data.corpus=[data/tang300/tang300.jsonl] data.val_fraction=0.05"
LONG+=" train.max_steps=100000 eval.every_steps=0 sample.every_steps=0 checkpoint.every_steps=0 log.every_steps=1"
# env --default-signal=INT: a background job of this non-interactive shell would start with
# SIGINT ignored, down to clean-stop.sh, which then could not trap it. SHELL=/bin/bash: script(1)
# runs its command through $SHELL -c, and dash (/bin/sh; SHELL unset) exits 130 on Ctrl-C after
# its child ended, whatever the child's code (see launch/clean_stop.sh).
env --default-signal=INT SHELL=/bin/bash script -qfec "env -i HOME='$HOME' PATH=/usr/local/bin:/usr/bin:/bin TERM=xterm bash --norc --noprofile -c \"cd '$MLLM_SOURCE_DIR' && MLLM_BUILD_DIR='$BUILD' && source launch/env.sh && mpirun -np 2 mllm-train recipes/mini.yaml $LONG\"" \
  "$WORK/tty" <&3 > /dev/null 2>&1 &
SPID=$!
for _ in $(seq 1 1200); do  # at most 120 s until 3 steps are logged
  [ -f "$WORK/stop/metrics.jsonl" ] && [ "$(wc -l < "$WORK/stop/metrics.jsonl")" -ge 3 ] && break
  kill -0 "$SPID" 2> /dev/null || break
  sleep 0.1
done
[ -f "$WORK/stop/metrics.jsonl" ] || { cat "$WORK/tty"; fail "the run under a terminal logged no step"; }
printf '\003' >&3
set +e; wait "$SPID"; code=$?; set -e
exec 3>&-
[ "$code" -eq 0 ] || { tail -30 "$WORK/tty"; fail "exit $code after Ctrl-C, want 0"; }
grep -q "clean-stop: SIGINT: asking every rank for a checkpointed stop" "$WORK/tty" ||
  { tail -30 "$WORK/tty"; fail "no clean-stop line on the terminal"; }
for r in 00 01; do
  grep -q "received a stop signal" "$WORK/stop/logs/rank_$r.log" || fail "rank $r did not stop on the signal"
done
latest=$(cat "$WORK/stop/checkpoints/latest")
step=$((10#${latest#step_}))
[ "$step" -ge 3 ] || fail "checkpoint at step $step"
grep -q "stopping at step $step: received a stop signal" "$WORK/stop/logs/rank_00.log" || fail "rank 0 did not stop at step $step"
echo "card_command: OK (Ctrl-C: checkpoint at step $step, exit 0)"
