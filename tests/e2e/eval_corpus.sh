#!/usr/bin/env bash
# mllm-eval: loss, perplexity and bits per character of a checkpoint on a text file.
# 1. A model whose weights are ~1e-30 (init_std and lr 1e-30) predicts the uniform distribution,
#    so the loss is ln V per predicted token exactly; the token and character counts follow from
#    the text (char tokenizer: one token per character, BOS and EOS per document, every token
#    but the first predicted). Checked at 1 and 2 ranks.
# 2. A trained checkpoint gives the same figures at 1, 2 and 4 ranks.
source "$(dirname "$0")/common.sh"
printf '%s\n' "床前明月光，疑是地上霜。" "舉頭望明月，低頭思故鄉。" "春眠不覺曉，處處聞啼鳥。夜來風雨聲，花落知多少。" \
  > "$WORK/text.txt"
train 1 "$WORK/flat" train.max_steps=1 model.init_std=1e-30 optim.lr=1e-30 schedule.min_lr=0 \
  eval.every_steps=0 > "$WORK/flat.log" 2>&1 || { tail "$WORK/flat.log"; fail "training the flat model"; }
vocab=$(grep -oE "data: vocab [0-9]+" "$WORK/flat.log" | grep -oE "[0-9]+$")
[ -n "$vocab" ] || fail "no vocabulary size in the log"
"$MLLM_BIN/mllm-eval" --checkpoint "$WORK/flat" --corpus "$WORK/text.txt" --seq-len 16 --batch 2 --json \
  > "$WORK/flat1.json" 2> "$WORK/e.err" || { cat "$WORK/e.err"; fail "mllm-eval np=1"; }
mpirun -np 2 --bind-to none "$MLLM_BIN/mllm-eval" --checkpoint "$WORK/flat" --corpus "$WORK/text.txt" \
  --seq-len 16 --batch 2 --json > "$WORK/flat2.json" 2> "$WORK/e.err" || { cat "$WORK/e.err"; fail "mllm-eval np=2"; }
python3 - "$WORK/text.txt" "$vocab" "$WORK/flat1.json" "$WORK/flat2.json" <<'PY' || fail "flat model figures"
import json, math, sys
docs = open(sys.argv[1], encoding="utf-8").read().splitlines()
V = int(sys.argv[2])
chars = sum(len(d) for d in docs)
tokens = sum(len(d) + 2 for d in docs) - 1
want = {"loss": math.log(V), "perplexity": V, "bits_per_char": tokens * math.log2(V) / chars,
        "tokens": tokens, "characters": chars, "documents": len(docs),
        "sequences": math.ceil(tokens / 16)}
for path in sys.argv[3:]:
    got = json.loads(open(path).read().strip().splitlines()[-1])
    print(path.rsplit("/", 1)[-1], {k: got[k] for k in want})
    for k, v in want.items():
        assert abs(got[k] - v) <= 1e-5 * abs(v), (path, k, got[k], v)
PY

train 1 "$WORK/trained" train.max_steps=6 eval.every_steps=0 > "$WORK/trained.log" 2>&1 || fail "training"
for np in 1 2 4; do
  if [ "$np" -eq 1 ]; then run=(); else run=(mpirun -np "$np" --bind-to none); fi
  "${run[@]}" "$MLLM_BIN/mllm-eval" --checkpoint "$WORK/trained/checkpoints/latest" --corpus "$CORPUS" \
    --batch 3 --json > "$WORK/np$np.json" 2> "$WORK/e.err" || { cat "$WORK/e.err"; fail "mllm-eval np=$np"; }
done
python3 - "$WORK"/np1.json "$WORK"/np2.json "$WORK"/np4.json <<'PY' || fail "figures depend on the rank count"
import json, sys
r = [json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[1:]]
print([(x["loss"], x["bits_per_char"], x["tokens"]) for x in r])
for x in r[1:]:
    assert x["tokens"] == r[0]["tokens"] and x["characters"] == r[0]["characters"], x
    for k in ("loss", "perplexity", "bits_per_char"):
        assert abs(x[k] - r[0][k]) <= 1e-9 * abs(r[0][k]), (k, x[k], r[0][k])
PY
set +e
"$MLLM_BIN/mllm-eval" --checkpoint "$WORK/trained" --corpus "$WORK/missing.txt" > "$WORK/out" 2>&1
code=$?
set -e
[ "$code" -eq 2 ] || { cat "$WORK/out"; fail "missing corpus: exit $code, expected 2"; }
echo PASS
