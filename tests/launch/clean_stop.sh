#!/usr/bin/env bash
# launch/clean-stop.sh with a stub COMMAND that logs the signals it gets (no mpirun, so it is
# fast and exact): COMMAND's exit code passes through; the first SIGINT or SIGTERM reaches it as
# SIGUSR1, a second SIGINT as SIGINT; SIGHUP as SIGHUP at once; a terminal's Ctrl-C (a pty from
# script(1)) reaches the script only, not COMMAND's own process group; no COMMAND is exit 2.
source "$(dirname "$0")/../e2e/common.sh"
C="$MLLM_SOURCE_DIR/launch/clean-stop.sh"
STUB="$WORK/stub.sh"
cat > "$STUB" <<'STUB'
#!/usr/bin/env bash
# Logs each signal; USR1 = a clean stop (exit 0; with "slow", a save that takes long: it goes
# on), INT/TERM/HUP = exit 128+n, as a rank would.
log=$1 slow=${2:-}
for s in USR1 INT TERM HUP; do
  trap "echo $s >> '$log'; if [ $s = USR1 ]; then [ -n '$slow' ] || exit 0; else exit \$((128 + \$(kill -l $s))); fi" "$s"
done
echo "started $$ pgid $(ps -o pgid= $$ | tr -d ' ')" >> "$log"
for _ in $(seq 1 300); do sleep 0.1; done
exit 9
STUB
chmod +x "$STUB"
# started LOG: waits until the stub has started.
started() { for _ in $(seq 1 100); do grep -q started "$1" 2>/dev/null && return 0; sleep 0.05; done; fail "the stub did not start"; }

set +e
"$C" bash -c 'exit 3'; rc=$?
[ "$rc" -eq 3 ] || fail "COMMAND's exit 3 came back as $rc"
"$C" > /dev/null 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "no COMMAND: exit $rc, want 2"
set -e

# SIGTERM once: USR1 to COMMAND, exit 0. (A background job of this non-interactive script
# ignores SIGINT from its start, and bash cannot trap what it inherited as ignored: SIGINT is
# tested on a terminal below.)
: > "$WORK/term.log"
"$C" "$STUB" "$WORK/term.log" 2> "$WORK/term.err" & P=$!
started "$WORK/term.log"
kill -TERM "$P"
set +e; wait "$P"; rc=$?; set -e
[ "$rc" -eq 0 ] || fail "SIGTERM: exit $rc, want 0 ($(cat "$WORK/term.log"))"
[ "$(grep -cv started "$WORK/term.log")" -eq 1 ] && grep -qx USR1 "$WORK/term.log" ||
  fail "SIGTERM reached COMMAND as: $(cat "$WORK/term.log")"
grep -q "clean-stop: SIGTERM: asking every rank for a checkpointed stop" "$WORK/term.err" || fail "no message"

# SIGHUP: passed on as it came.
: > "$WORK/hup.log"
"$C" "$STUB" "$WORK/hup.log" 2> /dev/null & P=$!
started "$WORK/hup.log"
kill -HUP "$P"
set +e; wait "$P"; rc=$?; set -e
grep -qx HUP "$WORK/hup.log" || fail "SIGHUP reached COMMAND as: $(cat "$WORK/hup.log")"
[ "$rc" -eq 129 ] || fail "SIGHUP: exit $rc, want COMMAND's 129"

# Ctrl-C on a terminal: once (USR1, exit 0), and twice (USR1 then INT: COMMAND's 130). COMMAND
# runs in a process group of its own, so the terminal's SIGINT never reaches it directly.
command -v script > /dev/null || { echo "SKIP the terminal part: no script(1)"; echo "clean_stop: OK"; exit 0; }
for presses in 1 2; do
  log="$WORK/tty$presses.log"; : > "$log"
  rm -f "$WORK/keys"; mkfifo "$WORK/keys"
  exec 3<> "$WORK/keys"
  # A background job of a non-interactive shell starts with SIGINT ignored, and what starts
  # ignored stays ignored down to clean-stop.sh: env restores the default first. script(1) runs
  # its command through $SHELL -c: pinned to bash, because dash (/bin/sh, or SHELL unset as in
  # CI) stays in the terminal's process group as COMMAND's parent and, on Ctrl-C, exits 130
  # after its child ended however it ended (bash waits and follows the child's 0).
  slow=""; [ "$presses" -eq 1 ] || slow=slow
  env --default-signal=INT SHELL=/bin/bash script -qfec "'$C' '$STUB' '$log' $slow" "$WORK/tty$presses" <&3 > /dev/null 2>&1 & S=$!
  started "$log"
  for _ in $(seq 1 "$presses"); do printf '\003' >&3; sleep 0.5; done
  set +e; wait "$S"; rc=$?; set -e
  exec 3>&-
  got=$(grep -v started "$log" | tr '\n' ' ' || true)
  spgid=$(sed -n 's/^started [0-9]* pgid //p' "$log")
  if [ "$presses" -eq 1 ]; then
    [ "$got" = "USR1 " ] && [ "$rc" -eq 0 ] || fail "one Ctrl-C: COMMAND got '$got', exit $rc"
  else
    [ "$got" = "USR1 INT " ] && [ "$rc" -eq 130 ] || fail "two Ctrl-C: COMMAND got '$got', exit $rc"
  fi
  [ -n "$spgid" ] || fail "no process group logged"
done
echo "clean_stop: OK"
