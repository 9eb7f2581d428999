#!/usr/bin/env bash
# Distributed preparation with the real program: mllm-prepare under mpirun -np 1, 2 and 3, at 1
# and 2 threads per rank, writes byte-identical caches from .jsonl, .txt, .gz, .zst (and Parquet
# when built with it) files, for the char and the bpe tokenizer. A rank killed mid-way leaves
# its finished pieces, and the re-run (at another world size) keeps them and writes the same
# bytes. Bad input in a late segment: exit 2, file:line counted from the file's start, one
# error line, nothing written.
source "$(dirname "$0")/common.sh"

formats=jsonl,txt,jsonl.gz,txt.zst
[ "${MLLM_PARQUET:-0}" = 1 ] && formats=$formats,parquet
"${MLLM_TORCH_PYTHON:-python3}" "$MLLM_SOURCE_DIR/bench/make_corpus.py" "$WORK/corpus" --bytes 1.2e6 --files 6 \
  --formats "$formats" --source "$CORPUS" > "$WORK/corpus.txt" || fail "make_corpus"
# Small files as well: they share segments.
for k in 1 2 3; do head -n $((k * 5)) "$CORPUS" > "$WORK/corpus/small-$k.jsonl"; done
FILES=$(ls "$WORK"/corpus/* | paste -sd, -)

# prepare NP THREADS CACHE [overrides...]
prepare() {
  local np=$1 threads=$2 cache=$3; shift 3
  local cmd=("$MLLM_BIN/mllm-prepare" "$RECIPE" "data.corpus=[$FILES]" "data.cache_dir=$cache"
             data.prepare_segment_bytes=100000 data.shard_tokens=60000 data.val_fraction=0.02
             -j "$threads" "$@")
  if [ "$np" -eq 1 ]; then "${cmd[@]}"; else mpirun -np "$np" --bind-to none "${cmd[@]}"; fi
}
# digest CACHE: one line per file of the prepared folder (the lock file aside): name and sha256.
digest() {
  (cd "$1"/*/ && find . -type f ! -name .prepare.lock -exec sha256sum {} + | sort -k2)
}

for tok in char bpe; do
  extra=(data.tokenizer.type=$tok)
  [ $tok = bpe ] && extra+=(data.tokenizer.vocab_size=3000 data.tokenizer.sample_bytes=300000)
  want=""
  for np in 1 2 3; do
    for threads in 1 2; do
      rm -rf "$WORK/c"
      prepare $np $threads "$WORK/c" "${extra[@]}" > "$WORK/log" 2>&1 ||
        { cat "$WORK/log"; fail "$tok: np $np x $threads threads failed"; }
      got=$(digest "$WORK/c")
      [ "$(echo "$got" | grep -c 'train-')" -ge 3 ] || { echo "$got"; fail "$tok: expected several train shards"; }
      if [ -z "$want" ]; then want=$got; fi
      [ "$got" = "$want" ] || { diff <(echo "$want") <(echo "$got"); fail "$tok: np $np x $threads threads wrote other bytes"; }
      echo "prepare_ranks: $tok np $np x $threads threads: $(echo "$got" | wc -l) files, identical"
    done
  done
  [ $tok = char ] && want_char=$want
done

# The BPE sample is a function of the documents alone (issue 56): a two-file corpus of very
# different document sizes (3-20 words, or 300-2,500), a sample budget far below the corpus, np
# 1/2/3 x 1/2 threads x both file orders: one tokenizer, byte for byte. (Before, dropping a
# document from the bounded sample freed room that a later, worse-ranked one filled, so the
# tokenizer followed the arrival order: here -j 1 and -j 2 at np 1 already differed.) Words of
# Latin syllables, so that a vocabulary of 800 is mostly merges, which the sample decides.
python3 - "$WORK/mixed" <<'PY'
import json, os, random, sys
rng = random.Random(5)
syll = [a + b for a in "bcdfghjklmnprstvwz" for b in ["a", "e", "i", "o", "u", "ai", "ou", "an", "en", "ing"]]
def word(): return "".join(rng.choice(syll) for _ in range(rng.randint(1, 4)))
os.makedirs(sys.argv[1], exist_ok=True)
for name in ("a", "b"):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w", encoding="utf-8") as f:
        for i in range(150):
            n = rng.randint(3, 20) if rng.random() < 0.7 else rng.randint(300, 2500)
            f.write(json.dumps({"text": f"{name}{i} " + " ".join(word() for _ in range(n))}) + "\n")
PY
tok_want=""
for files in "$WORK/mixed/a.jsonl,$WORK/mixed/b.jsonl" "$WORK/mixed/b.jsonl,$WORK/mixed/a.jsonl"; do
  for np in 1 2 3; do
    for threads in 1 2; do
      rm -rf "$WORK/t"
      FILES=$files prepare $np $threads "$WORK/t" data.tokenizer.type=bpe data.tokenizer.vocab_size=800 \
        data.tokenizer.sample_bytes=60000 > "$WORK/log" 2>&1 ||
        { cat "$WORK/log"; fail "mixed sizes: np $np x $threads threads failed"; }
      got=$(sha256sum "$WORK"/t/*/tokenizer.mllm | cut -d' ' -f1)
      [ -n "$tok_want" ] || tok_want=$got
      [ "$got" = "$tok_want" ] || { cat "$WORK/log"; fail "mixed sizes: np $np x $threads threads, files $files: another tokenizer"; }
    done
  done
done
echo "prepare_ranks: BPE sample of mixed document sizes: one tokenizer at np 1-3 x 1-2 threads x both file orders"

# A rank killed after its first pieces: the job fails; the re-run keeps the finished pieces.
rm -rf "$WORK/k"
set +e
MLLM_FAULT=prepare_kill:segment=3 prepare 3 1 "$WORK/k" > "$WORK/log" 2>&1
code=$?
set -e
[ "$code" -ne 0 ] || { cat "$WORK/log"; fail "a killed rank did not fail the job"; }
[ ! -e "$WORK"/k/*/manifest.json ] || fail "a manifest after a killed rank"
pieces=$(ls "$WORK"/k/*/pieces/*.val.bin | wc -l)
[ "$pieces" -ge 1 ] || fail "no finished piece kept"
prepare 2 2 "$WORK/k" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "re-run after the kill"; }
grep -q "were encoded by an earlier, interrupted run: kept" "$WORK/log" ||
  { cat "$WORK/log"; fail "the re-run did not keep the finished pieces"; }
[ "$(digest "$WORK/k")" = "$want_char" ] || fail "the re-run wrote other bytes"
echo "prepare_ranks: killed rank: $pieces finished piece(s) kept, same bytes"

# Bad input in a late segment of a plain file, under mpirun.
python3 - "$WORK/corpus/part-0000.jsonl" <<'PY'
import sys
lines = open(sys.argv[1], encoding="utf-8").read().split("\n")
lines[len(lines) * 3 // 4] = '{"text": "ok"'   # not JSON
open(sys.argv[1], "w", encoding="utf-8").write("\n".join(lines))
print(len(lines) * 3 // 4 + 1, file=open(sys.argv[1] + ".line", "w"))
PY
line=$(cat "$WORK/corpus/part-0000.jsonl.line"); rm "$WORK/corpus/part-0000.jsonl.line"
set +e
prepare 3 1 "$WORK/bad" > "$WORK/log" 2>&1
code=$?
set -e
[ "$code" -eq 2 ] || { cat "$WORK/log"; fail "bad input: exit $code, expected 2"; }
grep -q "part-0000.jsonl:$line: not valid JSON" "$WORK/log" ||
  { cat "$WORK/log"; fail "bad input: no file:line $line"; }
[ "$(grep -c "error" "$WORK/log")" -eq 1 ] || { cat "$WORK/log"; fail "expected one error line"; }
[ ! -e "$WORK/bad" ] || fail "bad input wrote into the cache"
echo "prepare_ranks: bad input at line $line: exit 2, one message, nothing written"
