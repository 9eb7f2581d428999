#!/usr/bin/env bash
# Parquet corpora (a string column, data.text_field): the same tokenizer and shards as the same
# documents in .jsonl, at 1 and 3 ranks with the file cut into runs of row groups; bad input
# names the file and the row group and row (exit 2, nothing written); a build or environment
# without the module says so.
source "$(dirname "$0")/common.sh"
: "${MLLM_TORCH_PYTHON:?set by ctest (the Python with pyarrow)}"

mkdir -p "$WORK/pq" "$WORK/js"
"$MLLM_TORCH_PYTHON" - "$CORPUS" "$WORK" <<'PY' || fail "writing the Parquet files"
import json, sys
import pyarrow as pa, pyarrow.parquet as pq
src, work = sys.argv[1], sys.argv[2]
poems = [json.loads(l)["text"] for l in open(src, encoding="utf-8") if l.strip()]
texts = [f"{c} {p}" for c in range(4) for p in poems]          # 1464 documents
titles = [str(i) for i in range(len(texts))]
pq.write_table(pa.table({"id": list(range(len(texts))), "body": texts, "title": titles}),
               f"{work}/pq/a.parquet", row_group_size=97)       # 16 row groups
pq.write_table(pa.table({"body": pa.array(texts[:300], pa.large_string())}), f"{work}/pq/b.parquet")
with open(f"{work}/js/a.jsonl", "w", encoding="utf-8") as f:
    for t in texts + texts[:300]:
        f.write(json.dumps({"body": t}, ensure_ascii=False) + "\n")
# Bad files.
pq.write_table(pa.table({"body": ["ok", None, "x"]}), f"{work}/null.parquet")
pq.write_table(pa.table({"body": pa.array([b"ok", b"bad \xc3( here"], pa.binary())}), f"{work}/utf8.parquet")
pq.write_table(pa.table({"body": [1, 2]}), f"{work}/int.parquet")
pq.write_table(pa.table({"text": ["a"], "title": ["t"]}), f"{work}/nocol.parquet")
pq.write_table(pa.table({"body": pa.array([["a", "b"]], pa.list_(pa.string()))}), f"{work}/list.parquet")
open(f"{work}/broken.parquet", "wb").write(open(f"{work}/pq/a.parquet", "rb").read()[:5000])
PY

prep() {  # prep NP CACHE CORPUS... (rest as overrides)
  local np=$1 cache=$2 corpus=$3; shift 3
  local cmd=("$MLLM_BIN/mllm-prepare" "$RECIPE" "data.corpus=[$corpus]" "data.cache_dir=$cache"
             data.text_field=body data.prepare_segment_bytes=20000 data.shard_tokens=40000 "$@")
  if [ "$np" -eq 1 ]; then "${cmd[@]}"; else mpirun -np "$np" --bind-to none "${cmd[@]}"; fi
}
prep 1 "$WORK/cj" "$WORK/js/a.jsonl" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "jsonl"; }
want=$(cd "$WORK"/cj/*/ && sha256sum tokenizer.mllm train-*.bin val-*.bin)
for np in 1 3; do
  rm -rf "$WORK/cp"
  prep $np "$WORK/cp" "$WORK/pq/a.parquet,$WORK/pq/b.parquet" > "$WORK/log" 2>&1 ||
    { cat "$WORK/log"; fail "parquet at np $np"; }
  grep -q "segment(s)" "$WORK/log" || fail "no plan line"
  got=$(cd "$WORK"/cp/*/ && sha256sum tokenizer.mllm train-*.bin val-*.bin)
  [ "$got" = "$want" ] || { diff <(echo "$want") <(echo "$got"); fail "parquet at np $np differs from the same documents in .jsonl"; }
  echo "prepare_parquet: np $np: $(echo "$got" | wc -l) files identical to the .jsonl run"
done

# bad FILE WHAT...: exit 2, the message has every WHAT, nothing written.
bad() {
  local file=$1; shift
  set +e
  prep 1 "$WORK/bad" "$WORK/$file" > "$WORK/log" 2>&1
  local code=$?
  set -e
  [ "$code" -eq 2 ] || { cat "$WORK/log"; fail "$file: exit $code, expected 2"; }
  for w in "$@"; do grep -qF -- "$w" "$WORK/log" || { cat "$WORK/log"; fail "$file: message lacks '$w'"; }; done
  [ ! -e "$WORK/bad" ] || fail "$file: something was written"
  echo "prepare_parquet: $file: exit 2 ($(grep -o 'error.*' "$WORK/log" | cut -c1-110))"
}
bad null.parquet "null.parquet: row group 0, row 1 (0-based)" "is null"
bad utf8.parquet "utf8.parquet: row group 0, row 1 (0-based): invalid UTF-8" "0xC3"
bad int.parquet "int.parquet" "column 'body'" "expected strings"
bad nocol.parquet "nocol.parquet" "no column 'body'" "text, title" "data.text_field"
bad list.parquet "list.parquet" "column 'body' is a nested (list or struct) column" "expected strings"
bad broken.parquet "broken.parquet"
MLLM_PARQUET_MODULE=$WORK/none.so bad pq/b.parquet "without Parquet support"
