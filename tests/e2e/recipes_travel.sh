#!/usr/bin/env bash
# Recipes that travel (issue 31, item 5): a copy of a bundled recipe in another folder keeps its
# relative `defaults:`; a bundled recipe by name runs from any folder, its corpus taken from the
# bundled folder (build/share/mllm links to the checkout) and its outputs written under the
# working directory; a corpus found nowhere names both places; --help-recipe lists `defaults`
# and says how paths resolve, and docs/recipe.md is its output.
source "$(dirname "$0")/common.sh"
SHARE=$(dirname "$MLLM_BIN")/share/mllm
mkdir -p "$WORK/elsewhere"
cd "$WORK/elsewhere"
cp "$MLLM_SOURCE_DIR/recipes/mini.yaml" my.yaml
"$MLLM_BIN/mllm-train" my.yaml --print-recipe > my.resolved 2> my.err ||
  { cat my.err; fail "a copy of recipes/mini.yaml in another folder"; }
"$MLLM_BIN/mllm-train" "$MLLM_SOURCE_DIR/recipes/mini.yaml" --print-recipe > mini.resolved
cmp -s my.resolved mini.resolved || { diff my.resolved mini.resolved | head; fail "the copy resolves differently"; }
grep -q "d_model: 128" my.resolved || fail "the copy lost minillm-tiny's d_model"
# A recipe that extends a bundled one by its file name, from a folder that has no such file.
printf 'defaults: [mini.yaml]\nmodel: {n_heads: 2}\n' > exp.yaml
"$MLLM_BIN/mllm-train" exp.yaml --print-recipe > exp.resolved || fail "defaults: [mini.yaml]"
diff mini.resolved exp.resolved > exp.diff || true
if [ "$(grep -c '^[<>]' exp.diff)" -ne 2 ] || ! grep -q '^> *n_heads: 2$' exp.diff; then
  cat exp.diff; fail "defaults: [mini.yaml] + n_heads 2 is not mini with 2 heads"
fi

# mllm-train mini from here: data/tang300/... is not under this folder, the bundled one has it.
"$MLLM_BIN/mllm-train" mini "data.corpus=[data/tang300/tang300.jsonl]" data.val_fraction=0.05 train.max_steps=2 \
  eval.every_steps=0 sample.every_steps=0 log.every_steps=1 > mini.log 2>&1 ||
  { tail -20 mini.log; fail "mllm-train mini from another folder"; }
grep -q "data.corpus 'data/tang300/tang300.jsonl': not in the working directory, taken from the bundled folder $SHARE" mini.log ||
  { grep -i corpus mini.log; fail "no line saying where the corpus came from"; }
[ "$(cat runs/mini/checkpoints/latest)" = step_000002 ] || fail "no run folder runs/mini under the working directory"
ls data/cache/tang-char/*/ > /dev/null || fail "the cache is not under the working directory"
[ ! -e "$SHARE/runs" ] || fail "wrote into the bundled folder"

# A corpus of another script: the bundled recipe's Chinese sample prompts are warned about once.
python3 -c "
import random
random.seed(3)
words = 'the quick brown fox jumps over a lazy dog while rain falls on quiet hills'.split()
for _ in range(400): print(' '.join(random.choice(words) for _ in range(12)))" > en.txt
"$MLLM_BIN/mllm-train" mini "data.corpus=[en.txt]" data.cache_dir=en-cache run.out_dir=en \
  train.max_steps=1 eval.every_steps=0 sample.every_steps=0 callbacks=[metrics,samples] > en.log 2>&1 ||
  { tail -20 en.log; fail "mllm-train mini on an English corpus"; }
grep -q "sample.prompts\[1\] '床前明月光': 5 token(s) not in the vocabulary become <UNK>" en.log ||
  { grep -i "sample" en.log; fail "no warning for prompts outside the vocabulary"; }
[ "$(grep -c "not in the vocabulary become <UNK>" en.log)" -eq 2 ] || fail "not one warning per prompt"

# Found nowhere: both places named, exit 2, nothing trained.
set +e
"$MLLM_BIN/mllm-train" mini "data.corpus=[data/nope.jsonl]" run.out_dir=nope > nope.log 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] || { cat nope.log; fail "a missing corpus gave exit $rc, not 2"; }
grep -q "data.corpus file 'data/nope.jsonl' does not exist or is not a regular file (working directory '$WORK/elsewhere', nor the bundled folder '$SHARE')" nope.log ||
  { cat nope.log; fail "the missing corpus message"; }

# The reference: the defaults row, the paths section; docs/recipe.md is that output.
"$MLLM_BIN/mllm-train" --help-recipe > help.md
grep -q '^| `defaults` | list of strings | `\[\]` | recipe files merged first' help.md || fail "no defaults row"
grep -q '^## Paths$' help.md || fail "no Paths section"
diff <(sed -n '/^## Paths$/,$p' "$MLLM_SOURCE_DIR/docs/recipe.md") help.md > recipe_md.diff ||
  { head -20 recipe_md.diff; fail "docs/recipe.md is not --help-recipe's output (regenerate it: docs/extending.md)"; }
echo "recipes_travel: OK"
