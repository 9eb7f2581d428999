#!/usr/bin/env bash
# The progress bar on a terminal (issue 31, item 4), through a pseudo-terminal (script(1)): under
# mpirun (the documented way to run) rank 0 draws it too, and no log line ever shares a line
# with it — the terminal's final screen, replayed here from the bytes, has every log line whole
# and no bar left after the run.
source "$(dirname "$0")/common.sh"
command -v script > /dev/null || { echo "SKIP: no script(1)"; exit 0; }
for np in 1 2; do
  cmd="$MLLM_BIN/mllm-train $RECIPE run.out_dir=$WORK/run$np data.cache_dir=$CACHE data.corpus=[$CORPUS] train.max_steps=30 log.every_steps=10"
  [ "$np" -eq 1 ] || cmd="mpirun -np 2 --bind-to none $cmd"
  SHELL=/bin/bash script -qfec "$cmd" "$WORK/tty$np" > /dev/null 2>&1 || { cat "$WORK/tty$np"; fail "np $np run on a terminal"; }
  python3 - "$WORK/tty$np" "$np" <<'PY' || fail "np $np: the terminal's screen"
import re, sys
raw = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
raw = re.sub(r"\x1b\[[0-9;]*m", "", raw)  # colours (the level on a terminal) take no columns
assert re.search(r"step \d+/30 \[=*>? *\] +\d+% loss", raw), "no progress bar drawn"
# Its eta written as the log line writes it ("7s", "3m05s", "7h41m"; not "0m07s").
etas = re.findall(r"step \d+/30 \[[^]]*\][^\r\n\x1b]* eta (\S+)", raw)
assert etas and all(re.fullmatch(r"\d+s|[1-9]\d*m\d\ds|\d+h\d\dm|\?", e) for e in etas), etas[:5]
# Replay the terminal: \n new line, \r column 0, ESC[K clears to the end of the line.
lines, cur, col = [], [], 0
i = 0
while i < len(raw):
    if raw.startswith("\x1b[K", i):
        del cur[col:]; i += 3; continue
    c = raw[i]; i += 1
    if c == "\n": lines.append("".join(cur)); cur, col = [], 0
    elif c == "\r": col = 0
    else:
        if col < len(cur): cur[col] = c
        else: cur.append(c)
        col += 1
lines.append("".join(cur))
logs = [l for l in lines if "] [info] " in l]
assert any("[info] step     30/30 (100%)" in l for l in logs), logs[-5:]
for l in lines:
    assert not ("] [info] " in l and not l.startswith("[")), f"a log line glued to the bar: {l!r}"
    assert not re.search(r"\] \d+% loss .*\[20\d\d-", l), f"bar and log on one line: {l!r}"
bars = [l for l in lines if re.match(r"step \d+/30 \[", l)]
assert not bars, f"the bar is left on screen after the run: {bars}"
print(f"np {sys.argv[2]}: bar drawn, {len(logs)} log lines whole, no bar left")
PY
done
echo "progress: OK"
