#!/usr/bin/env bash
# mllm as a user outside the tree meets it (docs/plugins.md):
#  1. `cmake --install` into a temporary prefix: programs, libmllm, headers, CMake package,
#     share/mllm; relative RPATHs; the installed mllm-train finds its bundled recipes by name;
#  2. examples/plugin built with find_package(mllm) against that prefix;
#  3. its recipe trained under mpirun -np 2 with the plugin's own keys (model.options.*,
#     loss_ema.*): the keys reach the model and the callback (EMA recomputed here from the
#     losses), the resolved recipe holds them, a resume compares them;
#  4. a misspelled plugin key refused with a suggestion, an out-of-range one with its range;
#  5. the same plugin built against an mllm stamped 0.0.9 refused, naming both versions;
#  6. `cpack -G DEB`, the package listed with dpkg-deb -c and its programs run from it.
set -euo pipefail
: "${MLLM_BUILD_DIR:?set by ctest}" "${MLLM_SOURCE_DIR:?set by ctest}"
# Pinned whatever the caller's environment: the checks read mllm-train's info lines ("world
# size 2", "resumed from", "model ...: N parameters"), the bundled recipes must come from the
# prefix's share/mllm, and no fault is injected.
export MLLM_LOG_LEVEL=info
unset MLLM_FAULT MLLM_SHARE_DIR
WORK=$(mktemp -d /tmp/mllm_install.XXXXXX)
cleanup() { [ -n "${KEEP_WORK:-}" ] && return 0; rm -rf "$WORK"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
has() { grep -qF -- "$2" "$1" || { echo "--- $1:"; cat "$1"; fail "$1 lacks: $2"; }; }
PREFIX=$WORK/prefix
VERSION=$(sed -n 's/^#define MLLM_VERSION_STRING "\(.*\)"$/\1/p' \
  "$MLLM_BUILD_DIR/generated/include/mllm/version.h")
[ -n "$VERSION" ] || fail "no MLLM_VERSION_STRING in the build's version.h"

echo "== 1. install into $PREFIX"
cmake --install "$MLLM_BUILD_DIR" --prefix "$PREFIX" > "$WORK/install.log"
for f in bin/mllm-train bin/mllm-prepare bin/mllm-generate bin/mllm-eval bin/mllm-export \
         lib/libmllm.so lib/libmllm_spm.so lib/libmllm_mkl_cpu.so \
         include/mllm/version.h include/mllm/core/plugin.h include/mllm/core/options.h \
         include/mllm/model/model.h lib/cmake/mllm/mllmConfig.cmake \
         lib/cmake/mllm/mllmConfigVersion.cmake lib/cmake/mllm/mllmTargets.cmake \
         lib/cmake/mllm/MllmTorch.cmake share/mllm/recipes/mini.yaml \
         share/mllm/configs/model/minillm-tiny.yaml share/mllm/data/tang300/tang300.jsonl \
         share/mllm/launch/mpirun.sh share/mllm/launch/slurm.sbatch; do
  [ -e "$PREFIX/$f" ] || fail "not installed: $f"
done
[ -x "$PREFIX/share/mllm/launch/sweep.sh" ] || fail "launch scripts lost their mode"
# RUNPATHs: relative for our own libraries, never into the build tree.
readelf -d "$PREFIX/bin/mllm-train" > "$WORK/rpath_train"
readelf -d "$PREFIX/lib/libmllm.so" > "$WORK/rpath_lib"
has "$WORK/rpath_train" '$ORIGIN/../lib'
has "$WORK/rpath_lib" '$ORIGIN'
if grep -qF "$MLLM_BUILD_DIR" "$WORK/rpath_train" "$WORK/rpath_lib"; then
  fail "an installed RUNPATH points into the build tree: $(grep -F "$MLLM_BUILD_DIR" "$WORK"/rpath_*)"
fi
# Bundled recipes by name, from a folder that is neither the sources nor the prefix.
mkdir -p "$WORK/elsewhere"
cd "$WORK/elsewhere"
"$PREFIX/bin/mllm-train" mini --print-recipe > mini.resolved || fail "mllm-train mini --print-recipe"
has mini.resolved "d_model: 128"
set +e
"$PREFIX/bin/mllm-train" no_such_recipe > nosuch.log 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] || fail "an unknown recipe name gave exit $rc, not 2"
has nosuch.log "recipe 'no_such_recipe' not found"
has nosuch.log "$PREFIX/share/mllm/recipes (bundled: gpt2-small, mini, poetry-all, tang-llama)"

echo "== 2. build examples/plugin against the prefix"
cp -r "$MLLM_SOURCE_DIR/examples/plugin" "$WORK/example"
EX=$WORK/example
cmake -S "$EX" -B "$EX/build" -DCMAKE_PREFIX_PATH="$PREFIX" > "$WORK/example_cmake.log" 2>&1 ||
  { cat "$WORK/example_cmake.log"; fail "configuring the example"; }
has "$WORK/example_cmake.log" "mllm: LibTorch from"
cmake --build "$EX/build" -j2 > "$WORK/example_build.log" 2>&1 ||
  { cat "$WORK/example_build.log"; fail "building the example"; }
[ -f "$EX/build/libmllm_gelu.so" ] || fail "no libmllm_gelu.so"

echo "== 3. train the example's recipe under mpirun -np 2"
cd "$EX"
CORPUS="data.corpus=[$PREFIX/share/mllm/data/tang300/tang300.jsonl]"
RUN=(mpirun -np 2 --bind-to none "$PREFIX/bin/mllm-train" gelu.yaml "$CORPUS"
     "data.cache_dir=$WORK/cache")
"${RUN[@]}" > train.log 2>&1 || { cat train.log; fail "training the example"; }
has train.log "gelu_mini: d_ff 128 (2 x d_model), activation gelu"
# The parameter count by hand, with d_ff = expansion x d_model = 128 (d 64, 2 layers, 32
# positions): V d + S d + L (4 (d^2 + d) + 2 d f + f + d + 4 d) + V d + V.
V=$(sed -n 's/.*data: vocab \([0-9]*\),.*/\1/p' train.log)
[ -n "$V" ] || fail "no vocabulary size in the log"
params=$(( V*64 + 32*64 + 2*(4*(64*64 + 64) + 2*64*128 + 128 + 64 + 4*64) + V*64 + V ))
has train.log "model gelu_mini: $params parameters"
has train.log "world size 2"
has runs/gelu/recipe.resolved.yaml "  options:
    expansion: 2
    activation: gelu"
has runs/gelu/recipe.resolved.yaml "loss_ema:
  every: 5
  beta: 0.8"
python3 - runs/gelu <<'PY' || fail "loss_ema does not follow the losses"
import json, sys
run = sys.argv[1]
loss = {}
for line in open(run + "/metrics.jsonl"):
    o = json.loads(line)
    if "loss" in o and "val_loss" not in o:
        loss[o["step"]] = o["loss"]
assert sorted(loss) == list(range(1, 41)), sorted(loss)
ema, expect = None, {}
for s in range(1, 41):
    ema = loss[s] if ema is None else 0.8 * ema + 0.2 * loss[s]
    if s % 5 == 0:
        expect[s] = ema
lines = [json.loads(l) for l in open(run + "/loss_ema.jsonl")]
got = {o["step"]: o["loss_ema"] for o in lines if "loss" in o}
assert sorted(got) == sorted(expect), (sorted(got), sorted(expect))
for s in expect:
    assert abs(got[s] - expect[s]) <= 1e-5 * abs(expect[s]), (s, got[s], expect[s])
# The eval hook (on_eval_end): each evaluation of metrics.jsonl, with the average at that step.
val = {o["step"]: o["val_loss"] for o in map(json.loads, open(run + "/metrics.jsonl")) if "val_loss" in o}
seen = {o["step"]: o for o in lines if "val_loss" in o}
assert sorted(seen) == sorted(val) == [20, 40], (sorted(seen), sorted(val))
for s in val:
    assert abs(seen[s]["val_loss"] - val[s]) <= 1e-6 * val[s], (s, seen[s], val[s])
    ema = None
    for k in range(1, s + 1):
        ema = loss[k] if ema is None else 0.8 * ema + 0.2 * loss[k]
    assert abs(seen[s]["loss_ema"] - ema) <= 1e-5 * ema, (s, seen[s], ema)
assert loss[40] < loss[1] - 0.5, (loss[1], loss[40])
print("loss_ema matches at", sorted(got), "; loss", loss[1], "->", loss[40])
PY
# Resume compares the plugin's keys: the model's options may not change, a callback's may.
set +e
"${RUN[@]}" train.max_steps=45 model.options.expansion=3 > resume_bad.log 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] || { cat resume_bad.log; fail "resume with another model.options.expansion: exit $rc, not 2"; }
has resume_bad.log "model.options.expansion: checkpoint 2 -> recipe 3"
"${RUN[@]}" train.max_steps=45 loss_ema.every=9 > resume_ok.log 2>&1 ||
  { cat resume_ok.log; fail "resume with another loss_ema.every"; }
has resume_ok.log "resumed from"
grep -q '"step": 45' <<<"$(tail -1 runs/gelu/loss_ema.jsonl)" || fail "the resumed run did not write step 45"
# mllm-generate on the plugin model's checkpoint: from the run's folder the recipe's relative
# plugin path works; from elsewhere it is refused (exit 2) unless --plugins names the library.
"$PREFIX/bin/mllm-generate" --checkpoint runs/gelu --prompt 春 --max-new-tokens 8 > gen.txt ||
  fail "mllm-generate on the gelu_mini checkpoint"
(cd "$WORK/elsewhere" && set +e
 "$PREFIX/bin/mllm-generate" --checkpoint "$EX/runs/gelu" --prompt 春 > gen_moved.log 2>&1
 [ $? -eq 2 ] || fail "mllm-generate without the plugin: not exit 2"
 "$PREFIX/bin/mllm-generate" --checkpoint "$EX/runs/gelu" --prompt 春 --max-new-tokens 8 \
   --plugins "$EX/build/libmllm_gelu.so" > gen_moved.txt || fail "mllm-generate --plugins")
has "$WORK/elsewhere/gen_moved.log" "the checkpoint was trained with plugin 'build/libmllm_gelu.so'"
has "$WORK/elsewhere/gen_moved.log" "give the plugins' current paths with --plugins PATH"
# mllm-eval the same way (issue 30: it failed without suggesting --plugins).
(cd "$WORK/elsewhere" && set +e
 "$PREFIX/bin/mllm-eval" --checkpoint "$EX/runs/gelu" \
   --corpus "$PREFIX/share/mllm/data/tang300/tang300.jsonl" > eval_moved.log 2>&1
 [ $? -eq 2 ] || fail "mllm-eval without the plugin: not exit 2"
 "$PREFIX/bin/mllm-eval" --checkpoint "$EX/runs/gelu" --plugins "$EX/build/libmllm_gelu.so" \
   --corpus "$PREFIX/share/mllm/data/tang300/tang300.jsonl" > eval_moved.txt 2>&1 ||
   { cat eval_moved.txt; fail "mllm-eval --plugins"; })
has "$WORK/elsewhere/eval_moved.log" "--plugins PATH"
# Two copies of one plugin: the error names both files (issue 30).
mkdir -p copy && cp build/libmllm_gelu.so copy/
set +e
"$PREFIX/bin/mllm-train" gelu.yaml "plugins=[build/libmllm_gelu.so, copy/libmllm_gelu.so]" \
  "$CORPUS" "data.cache_dir=$WORK/cache" run.out_dir=runs/twice > twice.log 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] || { cat twice.log; fail "two copies of the plugin: exit $rc, not 2"; }
has twice.log "is registered twice, by plugin '$EX/build/libmllm_gelu.so' and by plugin '$EX/copy/libmllm_gelu.so'"
# --help-recipe with the recipe lists the plugin's keys with their ranges.
"$PREFIX/bin/mllm-train" gelu.yaml --help-recipe > help.md
has help.md '| `model.options.expansion` | integer in [1, 16] | `4` |'
has help.md '| `loss_ema.beta` | number in [0, 1) | `0.9` |'

echo "== 4. bad plugin keys"
sed 's/expansion: 2/expansoin: 2/' gelu.yaml > bad.yaml
line=$(grep -n expansoin bad.yaml | cut -d: -f1)
set +e
"$PREFIX/bin/mllm-train" bad.yaml "$CORPUS" > bad.log 2>&1; rc=$?
"$PREFIX/bin/mllm-train" gelu.yaml "$CORPUS" model.options.expansion=64 > range.log 2>&1; rc2=$?
"$PREFIX/bin/mllm-train" gelu.yaml "$CORPUS" loss_ema.bta=0.5 > bad_cb.log 2>&1; rc3=$?
set -e
[ "$rc" -eq 2 ] && [ "$rc2" -eq 2 ] && [ "$rc3" -eq 2 ] || fail "bad keys: exits $rc $rc2 $rc3, not 2"
has bad.log "bad.yaml:$line:"
has bad.log "unknown key 'model.options.expansoin' (did you mean model.options.expansion?)"
has range.log "model.options.expansion: must be in [1, 16], got 64"
has bad_cb.log "unknown key 'loss_ema.bta' (did you mean loss_ema.beta?)"
[ ! -e runs/bad ] || fail "a refused recipe left a run folder"

echo "== 5. a plugin built against another mllm version"
cp -r "$PREFIX" "$WORK/prefix_old"
sed -i "s/^#define MLLM_VERSION_STRING \".*\"/#define MLLM_VERSION_STRING \"0.0.9\"/" \
  "$WORK/prefix_old/include/mllm/version.h"
cmake -S "$EX" -B "$EX/build_old" -DCMAKE_PREFIX_PATH="$WORK/prefix_old" > "$WORK/old_cmake.log" 2>&1 ||
  { cat "$WORK/old_cmake.log"; fail "configuring against the old prefix"; }
cmake --build "$EX/build_old" -j2 > "$WORK/old_build.log" 2>&1 ||
  { cat "$WORK/old_build.log"; fail "building against the old prefix"; }
set +e
"$PREFIX/bin/mllm-train" gelu.yaml "$CORPUS" "plugins=[build_old/libmllm_gelu.so]" \
  run.out_dir=runs/old > old.log 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] || { cat old.log; fail "a plugin of mllm 0.0.9 gave exit $rc, not 2"; }
has old.log "plugin 'build_old/libmllm_gelu.so' was built against mllm 0.0.9 (plugin ABI"
has old.log "but this is mllm $VERSION (plugin ABI"
[ ! -e runs/old ] || fail "a refused plugin left a run folder"

echo "== 6. the Debian package"
cpack -G DEB -B "$WORK/deb" --config "$MLLM_BUILD_DIR/CPackConfig.cmake" > "$WORK/cpack.log" 2>&1 ||
  { cat "$WORK/cpack.log"; fail "cpack -G DEB"; }
DEB=$(ls "$WORK"/deb/mllm_*.deb)
dpkg-deb -c "$DEB" > deb_contents.txt
for f in ./usr/bin/mllm-train ./usr/lib/libmllm.so ./usr/include/mllm/core/plugin.h \
         ./usr/lib/cmake/mllm/mllmConfig.cmake ./usr/share/mllm/recipes/mini.yaml \
         ./usr/share/mllm/launch/slurm.sbatch; do
  grep -q " $f\$" deb_contents.txt || { cat deb_contents.txt; fail "not in the .deb: $f"; }
done
dpkg-deb -I "$DEB" > deb_info.txt
has deb_info.txt "Package: mllm"
has deb_info.txt "Version: $VERSION"
has deb_info.txt "Depends: libyaml-cpp0.7"
# Unpacked anywhere, its programs run and find their recipes (relative RUNPATH, share/ lookup).
dpkg-deb -x "$DEB" "$WORK/unpacked"
"$WORK/unpacked/usr/bin/mllm-train" mini --print-recipe > deb_mini.txt
has deb_mini.txt "d_model: 128"
echo "$(grep -c . deb_contents.txt) entries in $(basename "$DEB") ($(du -h "$DEB" | cut -f1))"
echo "PASS"
