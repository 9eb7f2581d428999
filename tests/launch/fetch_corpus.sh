#!/usr/bin/env bash
# launch/convert_chinese_poetry.py and launch/fetch-corpus.sh on a hand-made miniature of the
# chinese-poetry sources: both layouts (npm package, git checkout) give the hand-written lines,
# files are read in numeric order, empty poems are skipped, ci take their tune name as title;
# fetch-corpus refuses a corpus whose sha256 is not the pinned one (exit 1, nothing written),
# names the places it looked when it has no source, and rejects bad arguments with exit 2;
# --all takes the Song collections from compressed copies, each pinned by its sha256.
source "$(dirname "$0")/../e2e/common.sh"
CONVERT="$MLLM_SOURCE_DIR/launch/convert_chinese_poetry.py"
FETCH="$MLLM_SOURCE_DIR/launch/fetch-corpus.sh"

# The same four source files in the npm layout (dist/quantangshi, dist/songci) and the git one.
write_sources() {  # SHI_DIR CI_DIR
  mkdir -p "$1" "$2"
  cat > "$1/poet.tang.0.json" <<'J'
[{"title": "春曉", "author": "孟浩然", "paragraphs": ["春眠不覺曉，處處聞啼鳥。", "夜來風雨聲，花落知多少。"]},
 {"title": "空", "author": "無名", "paragraphs": ["", "  "]}]
J
  cat > "$1/poet.tang.1000.json" <<'J'
[{"title": "", "author": " 佚名 ", "paragraphs": [" 白日依山盡 "]}]
J
  cat > "$1/poet.tang.200.json" <<'J'
[{"title": "靜夜思", "author": "李白", "paragraphs": ["床前明月光"]}]
J
  cat > "$1/poet.song.0.json" <<'J'
[{"title": "題西林壁", "author": "蘇軾", "paragraphs": ["橫看成嶺側成峰"]}]
J
  cat > "$2/ci.song.0.json" <<'J'
[{"rhythmic": "浣溪沙", "author": "晏殊", "paragraphs": ["一曲新詞酒一杯"]}]
J
}
write_sources "$WORK/npm/package/dist/quantangshi" "$WORK/npm/package/dist/songci"
write_sources "$WORK/git/全唐诗" "$WORK/git/宋词"

# Expected output, written by hand: numeric file order 0, 200, 1000; the empty poem skipped.
cat > "$WORK/tang.expected" <<'J'
{"text": "春曉\n春眠不覺曉，處處聞啼鳥。\n夜來風雨聲，花落知多少。", "title": "春曉", "author": "孟浩然"}
{"text": "靜夜思\n床前明月光", "title": "靜夜思", "author": "李白"}
{"text": "白日依山盡", "title": "", "author": "佚名"}
J
echo '{"text": "題西林壁\n橫看成嶺側成峰", "title": "題西林壁", "author": "蘇軾"}' > "$WORK/song.expected"
echo '{"text": "浣溪沙\n一曲新詞酒一杯", "title": "浣溪沙", "author": "晏殊"}' > "$WORK/ci.expected"

for layout in npm/package git; do
  out="$WORK/out-${layout%%/*}"
  python3 "$CONVERT" "$WORK/$layout" "$out" > /dev/null || fail "convert $layout"
  for name in tang song ci; do
    cmp -s "$out/$name.jsonl" "$WORK/$name.expected" ||
      fail "$layout: $name.jsonl differs: $(diff "$out/$name.jsonl" "$WORK/$name.expected")"
  done
done
python3 "$CONVERT" "$WORK/git" "$WORK/only" --only ci.jsonl > /dev/null || fail "--only"
[ "$(ls "$WORK/only")" = "ci.jsonl" ] || fail "--only ci.jsonl wrote $(ls "$WORK/only")"
set +e
msg=$(python3 "$CONVERT" "$WORK/npm" "$WORK/x" 2>&1); code=$?
set -e
[ $code -ne 0 ] && grep -q "neither the npm package" <<< "$msg" || fail "wrong source folder: $code $msg"

# fetch-corpus: a corpus other than the pinned one is refused, and nothing is left behind.
xz -c "$WORK/tang.expected" > "$WORK/tang.jsonl.xz"
set +e
msg=$(CORPUS_DIR="$WORK/c1" MLLM_CORPUS_XZ="$WORK/tang.jsonl.xz" "$FETCH" 2>&1); code=$?
set -e
[ $code -eq 1 ] || fail "wrong corpus from .xz: exit $code, want 1: $msg"
grep -q "expected 4f503fa181af641b2b43ffb1feca05c78686008c28def8582614180c99bab329" <<< "$msg" ||
  fail "checksum message: $msg"
[ -z "$(ls -A "$WORK/c1")" ] || fail "refused corpus left files: $(ls -A "$WORK/c1")"

set +e
msg=$(CORPUS_DIR="$WORK/c2" MLLM_CORPUS_XZ=none "$FETCH" --from "$WORK/git" 2>&1); code=$?
set -e
[ $code -eq 1 ] && grep -q "tang.jsonl from $WORK/git has sha256" <<< "$msg" || fail "--from: $code $msg"
[ ! -e "$WORK/c2/tang.jsonl" ] || fail "--from: refused corpus written"

# No source at all: a PATH without npm (only the tools the script uses).
mkdir "$WORK/bin"
for tool in bash python3 sha256sum cut mktemp mkdir rm mv cp xz tar dirname cat grep ls; do
  ln -s "$(command -v "$tool")" "$WORK/bin/$tool"
done
set +e
msg=$(PATH="$WORK/bin" CORPUS_DIR="$WORK/c3" MLLM_CORPUS_XZ=none "$FETCH" 2>&1); code=$?
set -e
[ $code -eq 1 ] || fail "no source: exit $code, want 1: $msg"
grep -q "no copy of the Tang corpus found" <<< "$msg" && grep -q -- "--from DIR" <<< "$msg" ||
  fail "no-source message: $msg"

# Bad arguments: exit 2.
for bad in "--bogus" "--from" "--from $WORK/nonexistent"; do
  set +e; CORPUS_DIR="$WORK/c4" "$FETCH" $bad > /dev/null 2>&1; code=$?; set -e
  [ $code -eq 2 ] || fail "'fetch-corpus.sh $bad' exited $code, want 2"
done
set +e; CORPUS_DIR="$WORK/c4" MLLM_CORPUS_XZ="$WORK/missing.xz" "$FETCH" > /dev/null 2>&1; code=$?; set -e
[ $code -eq 2 ] || fail "MLLM_CORPUS_XZ naming a missing file exited $code, want 2"
grep -q "MLLM_CORPUS_XZ" <<<"$("$FETCH" --help)" || fail "--help"

# --all from compressed copies (our machines: ../shared/corpus beside the checkout): every file
# pinned, a corrupt Song copy refused with nothing written. Skipped where that folder is absent.
SHARED="$MLLM_SOURCE_DIR/../shared/corpus"
if [ -f "$SHARED/tang.jsonl.xz" ] && [ -f "$SHARED/song.jsonl.xz" ] && [ -f "$SHARED/ci.jsonl.xz" ]; then
  mkdir "$WORK/xz"
  cp "$SHARED/tang.jsonl.xz" "$SHARED/ci.jsonl.xz" "$WORK/xz/"
  echo '{"text": "not the Song collection"}' | xz -c > "$WORK/xz/song.jsonl.xz"
  set +e
  msg=$(CORPUS_DIR="$WORK/c5" MLLM_CORPUS_XZ="$WORK/xz/tang.jsonl.xz" "$FETCH" --all 2>&1); code=$?
  set -e
  [ $code -eq 1 ] && grep -q "song.jsonl from $WORK/xz/song.jsonl.xz has sha256" <<< "$msg" &&
    grep -q "expected c75d9322f9f41df043c287fadc483dc6b532ee8cced098a7349e896308192053" <<< "$msg" ||
    fail "corrupt song.jsonl.xz: exit $code: $msg"
  [ ! -e "$WORK/c5/song.jsonl" ] || fail "a refused song.jsonl was written"
  cp "$SHARED/song.jsonl.xz" "$WORK/xz/"
  CORPUS_DIR="$WORK/c5" MLLM_CORPUS_XZ="$WORK/xz/tang.jsonl.xz" "$FETCH" --all > "$WORK/all.out" 2>&1 ||
    { cat "$WORK/all.out"; fail "--all from compressed copies"; }
  [ "$(wc -l < "$WORK/c5/song.jsonl")" -eq 254225 ] && [ "$(wc -l < "$WORK/c5/ci.jsonl")" -eq 21053 ] &&
    [ "$(wc -l < "$WORK/c5/tang.jsonl")" -eq 57603 ] || fail "--all: poem counts $(wc -l "$WORK"/c5/*.jsonl)"
  grep -q "ci.jsonl present and verified" <<< "$(CORPUS_DIR="$WORK/c5" "$FETCH" --all 2>&1)" ||
    fail "a second --all did not find the verified files"
else
  echo "fetch_corpus: --all from compressed copies skipped (no $SHARED)"
fi
echo "fetch_corpus: ok"
