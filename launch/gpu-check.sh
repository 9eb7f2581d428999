#!/usr/bin/env bash
# The GPU check: builds mllm against this machine's PyTorch, runs the GPU tests, trains on the
# GPU and compares every run with another one that must agree (the CPU, one rank against two,
# the PyTorch eager reference bench/torch_reference.py, transformers). Unattended, about 7
# minutes on one H200 (the build half of it). Writes OUT/report.json and OUT/report.md after every
# check (a timeout leaves the verdicts so far), every run's folder and log under OUT; exit 0 when
# every check passed.
#
#   launch/gpu-check.sh OUT
#
# Checks, in order (a failed one is reported and the rest still run):
#   build        cmake -DMLLM_WITH_NCCL=ON -DMLLM_GPU_TESTS=ON in $BUILD_DIR with LibTorch and NCCL
#                from $PYTHON's torch; only the targets below, on every core
#   gpu_tests    ctest -L gpu --no-tests=error (NCCL world of 1; the ordering tests use an
#                out-of-place collective behind a slow producer, with controls that must fail)
#   sync_debug   6 steps of the llama below with train.sync_debug: every host synchronisation of
#                a step, by phase and call stack (info)
#   observe      6 steps of the llama below with profile.steps=[4,5] and log.tensorboard: the
#                Chrome trace holds CUDA kernels and mllm's named ranges, one events file
#   mini         recipes/mini.yaml for 200 steps on the GPU (tokens/s, MFU), and the same on the
#                CPU (8 ranks): final val losses within 0.02 (dropout draws differ by device; 1, 2
#                and 4 CPU ranks, whose draws differ too, agreed within 1.2e-4 on tang300)
#   fp32_vs_cpu  10 fp32 steps (eager attention, TF32 off, no dropout) on the GPU and on the CPU:
#                every loss within 1e-4
#   fp32_parity  the val loss of those GPU weights, ours vs the reference: within 1e-5
#   np2_vs_np1   an fp32 llama (d 512, 8 layers, seq 512; eager, TF32 off) for 8 steps on 1 rank
#                (nccl) and on 2 ranks sharing the GPU (mpi, staged through pinned host memory),
#                the same global batch: every loss within 1e-5; and 1 rank at ZeRO stage 1
#                (DataParallel's buckets through NCCL), and at stage 2 with activation
#                checkpointing, against 1 rank at stage 0, within 1e-5
#   llama_np1    GPT-2-small-like llama (d 768, 12 layers, 12 heads, seq 1024, tied, bf16, sdpa)
#                for 60 steps on 1 rank: tokens/s, MFU against the measured bf16 GEMM peak
#   reference    the same shape in PyTorch eager (sdpa, fused AdamW): tokens/s, memory
#   bf16_parity  the val loss of the llama_np1 weights, ours vs the reference: within 1e-2
#   hf_export    mllm-export of the llama_np1 checkpoint; logits of the exported folder from an
#                independent Llama and from transformers' AutoModelForCausalLM within 1e-4
#   speed        llama_np1's tokens/s at least the reference's; mfu: reported against 40% (info)
#   bench        only when MLLM_GPU_CHECK_ONLY names it (launch/gpu-bench.sh): recipes/gpt2-small.yaml's
#                shape as mllm eager, mllm with CUDA graphs, PyTorch eager and torch.compile, each
#                with tokens/s, MFU, peak memory and kernels per step (bench_* rows, bench_summary)
# Every training run's log must name the backend it was meant to use (nccl, mpi staged; single
# and mpi on the CPU): a run that fell back to another fails its check. Peak GPU memory of each
# run is sampled with nvidia-smi (the whole process, CUDA context included).
#
# Environment: PYTHON (default python3: the one with torch), BUILD_DIR (default build-gpu),
# MLLM_GPU_CHECK_DEVICE=cpu runs the same steps on the CPU with tiny shapes (a plumbing test),
# MLLM_BIN=DIR uses programs built before (no build step), MLLM_GPU_CHECK_ONLY="check ..." runs
# only those checks. For tests of the verdicts (tests/launch/gpu_check_cpu.sh):
# MLLM_GPU_CHECK_OVERRIDES_<run>="key=value ..." adds overrides to one run and
# MLLM_GPU_CHECK_FAULT_<run>=SPEC gives it MLLM_FAULT=SPEC (runs: the folder names under OUT).
# Dependencies: installed, or launch/deps-prefix.sh's .deps/debs (unpacked here into .deps/prefix).
# Corpus: data/full/tang.jsonl when present (launch/fetch-corpus.sh), else the committed tang300.
# On the device tool: first, here, launch/deps-prefix.sh fetch .deps/debs and launch/fetch-corpus.sh;
# then carry [".deps/debs", "data/full"] (about 41 MB), timeout about 560 s, and a command that
# brings the report and the logs back (at most 8 files of 16 MB):
#   launch/gpu-check.sh /tmp/gc; cp /tmp/gc/report.* $OUT/;
#   tar czf $OUT/gc.tgz --exclude=checkpoints --exclude=cache-tang --exclude=hf_llama -C /tmp gc
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { sed -n '2,57p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
OUT=$1
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
PYTHON=${PYTHON:-python3}
BUILD=${BUILD_DIR:-build-gpu}
DEV=${MLLM_GPU_CHECK_DEVICE:-cuda}
export MLLM_GPU_CHECK_DEVICE=$DEV
REPORT=(python3 "$PWD/launch/gpu_check_report.py")
rm -f "$OUT/results.jsonl" "$OUT/report.json" "$OUT/report.md"
# One machine: loopback for OpenMPI's and NCCL's bootstrap, whatever the VM's other interfaces.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo NCCL_SOCKET_IFNAME=lo
export NCCL_DEBUG=${NCCL_DEBUG:-WARN} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

record() { "${REPORT[@]}" record "$OUT" "$@"; }
want() { [ -z "${MLLM_GPU_CHECK_ONLY:-}" ] || [[ " $MLLM_GPU_CHECK_ONLY " == *" $1 "* ]]; }
asked() { [[ " ${MLLM_GPU_CHECK_ONLY:-} " == *" $1 "* ]]; }  # checks left out of the default run
on_gpu() { [ "$DEV" = cuda ]; }
# peak_mem CMD...: runs CMD while sampling nvidia-smi; leaves the MiB it added in $PEAK_MIB.
peak_mem() {
  PEAK_MIB=null
  if on_gpu && command -v nvidia-smi > /dev/null; then
    local before; before=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$OUT/.mem" 2>/dev/null &
    local sampler=$!
    "$@"; local rc=$?
    kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
    PEAK_MIB=$(( $(sort -n "$OUT/.mem" | tail -1 | tr -dc 0-9) + 0 - ${before:-0} ))
    return $rc
  fi
  "$@"
}

# ---- dependencies and build --------------------------------------------------------------
if [ -n "${MLLM_BIN:-}" ]; then
  BIN=$MLLM_BIN
  record build skipped "bin=\"$BIN\""
else
  DEPS_ARGS=""
  if [ ! -f .deps/prefix/env.sh ] && [ -d .deps/debs ] &&
     ! launch/deps-prefix.sh unpack .deps/debs .deps/prefix > "$OUT/deps.log" 2>&1; then
    record deps fail "log=\"$OUT/deps.log\""
    tail -20 "$OUT/deps.log"
    exit 1
  fi
  if [ -f .deps/prefix/env.sh ]; then
    # shellcheck disable=SC1091
    source .deps/prefix/env.sh
    DEPS_ARGS=$(launch/deps-prefix.sh cmake-args .deps/prefix)
  fi
  gen=(); command -v ninja > /dev/null && [ ! -f "$BUILD/CMakeCache.txt" ] && gen=(-G Ninja)
  targets=(mllm-train mllm-export)
  if on_gpu; then
    gpu_args=(-DMLLM_WITH_NCCL=ON -DMLLM_GPU_TESTS=ON -DMLLM_NCCL_TEST_NP=1)
    targets+=(mllm_nccl_core_tests mllm_nccl_tests)
  else
    gpu_args=(-DMLLM_GPU_TESTS=OFF)
  fi
  t0=$SECONDS
  # shellcheck disable=SC2086
  if cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DMLLM_PYTHON="$(command -v "$PYTHON")" \
       "${gpu_args[@]}" -DMLLM_BUILD_BENCH=OFF $DEPS_ARGS > "$OUT/build.log" 2>&1 &&
     cmake --build "$BUILD" -j"$(nproc)" --target "${targets[@]}" >> "$OUT/build.log" 2>&1; then
    record build pass "seconds=$((SECONDS - t0))" "targets=\"${targets[*]}\""
  else
    record build fail "seconds=$((SECONDS - t0))" "log=\"$OUT/build.log\""
    tail -30 "$OUT/build.log"
    exit 1
  fi
  BIN="$BUILD/bin"
fi
"$BIN/mllm-train" --help > /dev/null || { record build fail "why=\"mllm-train does not start\""; exit 1; }

# ---- GPU unit tests ----------------------------------------------------------------------
if want gpu_tests; then
  if on_gpu; then
    t0=$SECONDS
    if ctest --test-dir "$BUILD" -L gpu --no-tests=error --output-on-failure > "$OUT/gpu_tests.log" 2>&1; then st=pass; else st=fail; fi
    summary=$(grep -E "tests passed|No tests were found" "$OUT/gpu_tests.log" | tail -1)
    record gpu_tests $st "tests=$(grep -c "Test *#" "$OUT/gpu_tests.log")" "summary=\"$summary\"" \
      "seconds=$((SECONDS - t0))"
  else
    record gpu_tests skipped "why=\"no GPU (MLLM_GPU_CHECK_DEVICE=cpu)\""
  fi
fi

# ---- shapes ------------------------------------------------------------------------------
if [ -f data/full/tang.jsonl ]; then CORPUS=data/full/tang.jsonl VALF=0.02; else CORPUS=data/tang300/tang300.jsonl VALF=0.1; fi
common=(data.corpus="[$CORPUS]" data.val_fraction=$VALF train.device=$DEV sample.every_steps=0
        sample.max_new_tokens=8 checkpoint.every_steps=0 checkpoint.resume=none data.cache_dir="$OUT/cache-tang")
if on_gpu; then
  MINI_STEPS=200 MINI_CPU_NP=8
  LLAMA=(model.type=llama model.d_model=768 model.n_heads=12 model.n_kv_heads=12 model.n_layers=12
         model.d_ff=0 model.multiple_of=256 model.tie_embeddings=true model.dropout=0
         data.seq_len=1024 train.micro_batch=8 train.global_batch=16 train.max_steps=60)
  FP32_LLAMA=(model.type=llama model.d_model=512 model.n_heads=8 model.n_kv_heads=8 model.n_layers=8
              model.d_ff=0 model.multiple_of=256 model.dropout=0 data.seq_len=512 train.micro_batch=8
              train.global_batch=16 train.max_steps=8)
  REF_SHAPE=(--d-model 768 --n-heads 12 --n-layers 12 --multiple-of 256 --tie --seq-len 1024
             --micro-batch 8 --steps 20)
  NP1=nccl NP2="mpi staged"
else
  MINI_STEPS=20 MINI_CPU_NP=2
  LLAMA=(model.type=llama model.d_model=64 model.n_heads=4 model.n_kv_heads=4 model.n_layers=2
         model.d_ff=0 model.multiple_of=32 model.tie_embeddings=true model.dropout=0
         data.seq_len=64 train.micro_batch=4 train.global_batch=8 train.max_steps=6 train.threads=1)
  FP32_LLAMA=(model.type=llama model.d_model=64 model.n_heads=4 model.n_kv_heads=4 model.n_layers=2
              model.d_ff=0 model.multiple_of=32 model.dropout=0 data.seq_len=64 train.micro_batch=4
              train.global_batch=8 train.max_steps=8 train.threads=1)
  REF_SHAPE=(--d-model 64 --n-heads 4 --n-layers 2 --multiple-of 32 --tie --seq-len 64
             --micro-batch 4 --steps 3 --threads 2)
  NP1=single NP2=mpi
fi
train() {  # NAME NP OVERRIDES...: mllm-train recipes/mini.yaml into OUT/NAME, log OUT/NAME.log
  local name=$1 np=$2; shift 2
  rm -rf "${OUT:?}/$name"
  local extra_var="MLLM_GPU_CHECK_OVERRIDES_$name" fault_var="MLLM_GPU_CHECK_FAULT_$name" extra=()
  [ -n "${!extra_var:-}" ] && read -r -a extra <<< "${!extra_var}"
  local cmd=("$BIN/mllm-train" recipes/mini.yaml run.out_dir="$OUT/$name" "${common[@]}" "$@" "${extra[@]}")
  [ "$np" -gt 1 ] && cmd=(mpirun -np "$np" --bind-to none --oversubscribe "${cmd[@]}")
  MLLM_FAULT="${!fault_var:-}" peak_mem "${cmd[@]}" > "$OUT/$name.log" 2>&1
}
# backend NAME WANT: the JSON verdict on the backend run NAME's log names; status 1 when not WANT.
backend() { "${REPORT[@]}" backend "$OUT/$1.log" "$2"; }
metrics() { "${REPORT[@]}" metrics "$OUT/$1"; }
# value JSON KEY: one field of a JSON object (empty when missing).
value() { python3 -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2]); print("" if v is None else json.dumps(v))' "$1" "$2"; }
# within A B TOL: exit 0 when both are numbers and |A - B| <= TOL.
within() { python3 -c 'import sys; a,b,t=sys.argv[1:]; sys.exit(0 if a and b and abs(float(a)-float(b)) <= float(t) else 1)' "$1" "$2" "$3" 2>/dev/null; }

# ---- sync debug: the host synchronisations of a step, first ------------------------------
llama_bf16=("${LLAMA[@]}" schedule.warmup_steps=2 train.precision=bf16 model.attn_impl=sdpa
            eval.batches=4)
if want sync_debug; then
  if train sync_debug 1 "${llama_bf16[@]}" train.max_steps=6 train.sync_debug=true log.every_steps=1 \
       eval.every_steps=0; then
    b=$(backend sync_debug "$NP1"); brc=$?
    s=$("${REPORT[@]}" sync-debug "$OUT/sync_debug"); src=$?
    if [ $brc -eq 0 ] && [ $src -eq 0 ]; then st=info; else st=fail; fi
    record sync_debug $st "backend=$b" "per_step=$(value "$s" per_step)" "sync_sites=$(value "$s" sites)"
  else
    record sync_debug fail "log=\"$OUT/sync_debug.log\""
  fi
fi

# ---- observe: a profiler trace and TensorBoard events of a GPU run ------------------------
if want observe; then
  if train observe 1 "${llama_bf16[@]}" train.max_steps=6 log.every_steps=1 eval.every_steps=0 \
       checkpoint.every_steps=0 "profile.steps=[4,5]" log.tensorboard=true; then
    o=$(python3 - "$OUT/observe" "$DEV" <<'PY'
import glob, json, sys
run, dev = sys.argv[1], sys.argv[2]
ev = json.load(open(run + "/profile/rank_00.json"))["traceEvents"]
names = {e["name"] for e in ev if e.get("cat") == "mllm"}
kernels = [e for e in ev if e.get("cat") == "kernel"]
runtime = {e["name"] for e in ev if e.get("cat") == "cuda_runtime"}
ok = {"forward", "backward", "optimizer", "step 4", "step 5"} <= names and \
     (dev != "cuda" or len(kernels) > 0) and len(glob.glob(run + "/tensorboard/events.out.tfevents.*")) == 1
print(json.dumps({"ok": ok, "events": len(ev), "ranges": sorted(names), "kernels": len(kernels),
                  "syncs": sorted(n for n in runtime if "ynchronize" in n or "Memcpy" in n)}))
sys.exit(0 if ok else 1)
PY
    ); orc=$?
    if [ $orc -eq 0 ]; then st=pass; else st=fail; fi
    [ -n "$o" ] || o='{}'
    record observe $st "_=$o"
  else
    record observe fail "log=\"$OUT/observe.log\""
  fi
fi

# ---- mini on the GPU, and on the CPU -----------------------------------------------------
if want mini; then
  t0=$SECONDS
  mini=(train.max_steps=$MINI_STEPS schedule.warmup_steps=10 eval.every_steps=$MINI_STEPS)
  if train mini 1 "${mini[@]}" && MINI_MIB=$PEAK_MIB && train mini_cpu $MINI_CPU_NP "${mini[@]}" train.device=cpu; then
    g=$(metrics mini); c=$(metrics mini_cpu)
    b=$(backend mini "$NP1"); brc=$?
    bc=$(backend mini_cpu mpi); bcrc=$?
    st=fail
    [ $brc -eq 0 ] && [ $bcrc -eq 0 ] && within "$(value "$g" val_loss)" "$(value "$c" val_loss)" 0.02 && st=pass
    record mini $st "seconds=$((SECONDS - t0))" "tokens_per_s=$(value "$g" tokens_per_s)" \
      "mfu=$(value "$g" mfu)" "val_loss=$(value "$g" val_loss)" "cpu_val_loss=$(value "$c" val_loss)" \
      "tolerance=0.02" "backend=$b" "cpu_backend=$bc" "peak_mib=$MINI_MIB"
  else
    record mini fail "log=\"$OUT/mini.log / mini_cpu.log\""
  fi
fi

# ---- fp32: GPU vs CPU, and ours vs the reference -----------------------------------------
exact=(train.max_steps=10 schedule.warmup_steps=2 log.every_steps=1 eval.every_steps=10 eval.batches=4
       model.dropout=0 model.attn_dropout=0 model.attn_impl=eager train.tf32=false)
if want fp32_vs_cpu || want fp32_parity; then
  if train fp32_gpu 1 "${exact[@]}" && train fp32_cpu 1 "${exact[@]}" train.device=cpu; then
    b=$(backend fp32_gpu "$NP1"); brc=$?
    cmp=$("${REPORT[@]}" compare "$OUT/fp32_gpu" "$OUT/fp32_cpu" 1e-4 --steps 10); crc=$?
    if [ $brc -eq 0 ] && [ $crc -eq 0 ]; then st=pass; else st=fail; fi
    record fp32_vs_cpu $st "_=$cmp" "backend=$b"
    ours=$(value "$(metrics fp32_gpu)" val_loss)
    "$PYTHON" bench/torch_reference.py val-loss "$OUT/fp32_gpu" --device "$DEV" > "$OUT/fp32_parity.log" 2>&1
    theirs=$("${REPORT[@]}" ref-value "$OUT/fp32_parity.log" val_loss)
    if within "$ours" "$theirs" 1e-5; then st=pass; else st=fail; fi
    record fp32_parity $st "ours=${ours:-null}" "reference=${theirs:-null}" "tolerance=1e-5"
  else
    record fp32_vs_cpu fail "log=\"$OUT/fp32_gpu.log / fp32_cpu.log\""
  fi
fi

# ---- one rank against two sharing the GPU (mpi, staged through pinned host memory) -------
if want np2_vs_np1; then
  t0=$SECONDS
  same=("${FP32_LLAMA[@]}" schedule.warmup_steps=2 log.every_steps=1 eval.every_steps=0
        model.attn_impl=eager train.tf32=false)
  # np1_zero1: the same 1-rank run at ZeRO stage 1, whose buckets (hooks, device-side flags,
  # reduce-scatter, all-gather) go through NCCL even at world size 1, where stage 0 needs none.
  # np1_zero2_ac: stage 2 (buckets freed after their reduce-scatter, gradient shards) with
  # every block checkpointed (the CUDA generator rewound for the recomputation's dropout).
  # np1_zero3_ac: stage 3 (each block's storage freed and re-gathered through NCCL around its
  # forward and backward, the caching allocator handing it back) with checkpointing.
  if train np1 1 "${same[@]}" && train np2 2 "${same[@]}" dist.backend=mpi &&
     train np1_zero1 1 "${same[@]}" dist.zero_stage=1 &&
     train np1_zero2_ac 1 "${same[@]}" dist.zero_stage=2 model.activation_checkpointing=full &&
     train np1_zero3_ac 1 "${same[@]}" dist.zero_stage=3 model.activation_checkpointing=full; then
    b1=$(backend np1 "$NP1"); r1=$?
    b2=$(backend np2 "$NP2"); r2=$?
    bz=$(backend np1_zero1 "$NP1"); rz=$?
    cmp=$("${REPORT[@]}" compare "$OUT/np1" "$OUT/np2" 1e-5 --steps 8); crc=$?
    cz=$("${REPORT[@]}" compare "$OUT/np1" "$OUT/np1_zero1" 1e-5 --steps 8); czrc=$?
    c2=$("${REPORT[@]}" compare "$OUT/np1" "$OUT/np1_zero2_ac" 1e-5 --steps 8); c2rc=$?
    c3=$("${REPORT[@]}" compare "$OUT/np1" "$OUT/np1_zero3_ac" 1e-5 --steps 8); c3rc=$?
    if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ $rz -eq 0 ] && [ $crc -eq 0 ] && [ $czrc -eq 0 ] &&
       [ $c2rc -eq 0 ] && [ $c3rc -eq 0 ]; then
      st=pass; else st=fail; fi
    record np2_vs_np1 $st "_=$cmp" "backend_np1=$b1" "backend_np2=$b2" "zero1_vs_np1=$cz" \
      "backend_zero1=$bz" "zero2_ac_vs_np1=$c2" "zero3_ac_vs_np1=$c3" "seconds=$((SECONDS - t0))"
  else
    record np2_vs_np1 fail "log=\"$OUT/np1.log / np2.log\""
  fi
fi

# ---- the GPT-2-small-like llama: ours, the reference -------------------------------------
if want llama_np1 || want speed || want bf16_parity || want hf_export; then
  t0=$SECONDS
  m='{}'  # llama_np1's metrics (gpu_check_report.py metrics), read once
  if train llama_np1 1 "${llama_bf16[@]}" log.every_steps=5 eval.every_steps=0 checkpoint.every_steps=0; then
    m=$(metrics llama_np1 || echo '{}')
    b=$(backend llama_np1 "$NP1"); brc=$?
    if [ $brc -eq 0 ]; then st=pass; else st=fail; fi
    record llama_np1 $st "seconds=$((SECONDS - t0))" "_=$m" "backend=$b" "peak_mib=$PEAK_MIB"
  else
    record llama_np1 fail "log=\"$OUT/llama_np1.log\""
  fi
  VOCAB=$(sed -n 's/.*data: vocab \([0-9]*\),.*/\1/p' "$OUT/llama_np1.log" | head -1)
  ref_speed=""
  if [ -n "$VOCAB" ] && peak_mem "$PYTHON" bench/torch_reference.py train-speed --type llama --vocab "$VOCAB" \
       "${REF_SHAPE[@]}" --bf16 --sdpa --device "$DEV" > "$OUT/reference.log" 2>&1 &&
     ref=$(grep '^{' "$OUT/reference.log" | tail -1) && [ -n "$ref" ]; then
    ref_speed=$(value "$ref" tokens_per_s)
    record reference pass "_=$ref" "peak_mib=$PEAK_MIB"
  else
    record reference fail "log=\"$OUT/reference.log\""
  fi
  if [ -d "$OUT/llama_np1/checkpoints" ]; then
    ours=$(value "$m" val_loss)
    "$PYTHON" bench/torch_reference.py val-loss "$OUT/llama_np1" --device "$DEV" --bf16 > "$OUT/bf16_parity.log" 2>&1
    theirs=$("${REPORT[@]}" ref-value "$OUT/bf16_parity.log" val_loss)
    if within "$ours" "$theirs" 1e-2; then st=pass; else st=fail; fi
    record bf16_parity $st "ours=${ours:-null}" "reference=${theirs:-null}" "tolerance=1e-2"
    if "$BIN/mllm-export" --checkpoint "$OUT/llama_np1" --out "$OUT/hf_llama" > "$OUT/hf_export.log" 2>&1 &&
       "$PYTHON" tests/assets/model/hf_llama_reference.py compare "$OUT/hf_llama" "$OUT/llama_np1" --atol 1e-4 \
         >> "$OUT/hf_export.log" 2>&1; then
      record hf_export pass "results=[$(grep '^{' "$OUT/hf_export.log" | paste -sd, -)]"
    else
      record hf_export fail "log=\"$OUT/hf_export.log\""
    fi
  else
    record bf16_parity fail "why=\"llama_np1 left no checkpoint\""
  fi
  # The speed targets of the GPU issue: ours at least the reference's tokens/s on this shape;
  # MFU against the measured bf16 GEMM peak, target 40% (reported, not judged).
  ours_speed=$(value "$m" tokens_per_s)
  mfu=$(value "$m" mfu)
  if [ -n "$ours_speed" ] && [ -n "$ref_speed" ]; then
    ratio=$(python3 -c "print(round($ours_speed / $ref_speed, 3))")
    if ! on_gpu; then st=info; elif python3 -c "import sys; sys.exit(0 if $ours_speed >= $ref_speed else 1)"; then st=pass; else st=fail; fi
    record speed $st "ours_tokens_per_s=$ours_speed" "reference_tokens_per_s=$ref_speed" "ratio=$ratio"
    record mfu info "mfu=${mfu:-null}" "target=0.40" \
      "met=$(python3 -c "print('true' if ${mfu:-0} >= 0.40 else 'false')")"
  else
    record speed fail "why=\"no tokens/s from llama_np1 or the reference\""
  fi
fi

# ---- bench: the GPU throughput figures on recipes/gpt2-small.yaml (launch/gpu-bench.sh) --------
# Only when MLLM_GPU_CHECK_ONLY names it. The same shape, one micro-batch per optimizer step, run
# four ways: mllm eager (recipes/gpt2-small.yaml as it is, on its BPE of 50,257 pieces), mllm with
# CUDA graphs, PyTorch eager and PyTorch torch.compile (bench/torch_reference.py, random ids of
# the same vocabulary). Each: tokens/s (median step), MFU against mllm's measured bf16 GEMM peak,
# peak memory (nvidia-smi: the whole process), and from a profiled window of 2 steps the device
# kernels per step and the top kernels by time (gpu_check_report.py trace-kernels).
if asked bench; then
  if on_gpu; then
    BENCH_OVR=()
    BENCH_REF=(--d-model 768 --n-heads 12 --n-layers 12 --multiple-of 256 --tie --seq-len 1024
               --micro-batch 16 --steps 20 --warmup 5)
    BENCH_MB=16 BENCH_STEPS=30 BENCH_COMPILE=inductor
  else
    BENCH_OVR=(model.d_model=64 model.n_heads=4 model.n_kv_heads=4 model.n_layers=2 model.multiple_of=32
               data.seq_len=64 "data.corpus=[data/tang300/tang300.jsonl]" data.val_fraction=0.1
               data.tokenizer.type=char data.cache_dir="$OUT/cache-bench" train.threads=2)
    BENCH_REF=(--d-model 64 --n-heads 4 --n-layers 2 --multiple-of 32 --tie --seq-len 64
               --micro-batch 4 --steps 3 --warmup 2 --threads 2)
    BENCH_MB=4 BENCH_STEPS=8 BENCH_COMPILE=aot_eager  # TorchInductor's C++ build: 80 s here
  fi
  t0=$SECONDS
  rm -rf "${OUT:?}/bench_mllm"
  first=$((BENCH_STEPS - 3))
  if peak_mem "$BIN/mllm-train" recipes/gpt2-small.yaml run.out_dir="$OUT/bench_mllm" train.device=$DEV \
       train.global_batch=$BENCH_MB train.micro_batch=$BENCH_MB train.max_steps=$BENCH_STEPS \
       schedule.warmup_steps=5 log.every_steps=1 eval.every_steps=0 checkpoint.every_steps=0 \
       checkpoint.resume=none sample.every_steps=0 "profile.steps=[$first,$((first + 1))]" \
       "${BENCH_OVR[@]}" > "$OUT/bench_mllm.log" 2>&1; then
    m=$(metrics bench_mllm || echo '{}')
    k=$("${REPORT[@]}" trace-kernels "$OUT/bench_mllm/profile/rank_00.json" 2 || echo '{}')
    b=$(backend bench_mllm "$NP1"); brc=$?
    if [ $brc -eq 0 ]; then st=info; else st=fail; fi
    record bench_mllm_eager $st "seconds=$((SECONDS - t0))" "_=$m" "peak_mib=$PEAK_MIB" "_=$k" \
      "backend=$b"
  else
    record bench_mllm_eager fail "log=\"$OUT/bench_mllm.log\""
  fi
  record bench_mllm_graphs skipped "why=\"train.cuda_graphs is not built yet (the GPU throughput issue, item 1)\""
  BVOCAB=$(sed -n 's/.*data: vocab \([0-9]*\),.*/\1/p' "$OUT/bench_mllm.log" | head -1)
  BPARAMS=$(sed -n 's/.*model llama: \([0-9]*\) parameters.*/\1/p' "$OUT/bench_mllm.log" | head -1)
  # MFU of the PyTorch runs against the same peak: the TFLOP/s mllm's start-up line measured.
  BPEAK=$(sed -n 's/.*MFU peak \([0-9.]*\) \([GT]\)FLOP\/s.*/\1\2/p' "$OUT/bench_mllm.log" | head -1)
  for mode in eager compile; do
    t0=$SECONDS
    flag=(); [ $mode = compile ] && flag=(--compile --compile-backend $BENCH_COMPILE)
    if [ -n "$BVOCAB" ] && peak_mem "$PYTHON" bench/torch_reference.py train-speed --type llama \
         --vocab "$BVOCAB" "${BENCH_REF[@]}" --bf16 --sdpa --device "$DEV" "${flag[@]}" \
         --profile-steps 2 --trace "$OUT/bench_torch_$mode.trace.json" > "$OUT/bench_torch_$mode.log" 2>&1 &&
       ref=$(grep '^{' "$OUT/bench_torch_$mode.log" | tail -1) && [ -n "$ref" ]; then
      k=$("${REPORT[@]}" trace-kernels "$OUT/bench_torch_$mode.trace.json" 2 || echo '{}')
      mfu=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); p=sys.argv[2]
print(round(r["achieved_tflops"] / (float(p[:-1]) / (1e3 if p[-1] == "G" else 1)), 4) if p else "null")' \
        "$ref" "$BPEAK")
      # The same model as mllm's: the parameter counts must agree.
      if [ "$(value "$ref" params)" = "$BPARAMS" ]; then st=info; else st=fail; fi
      record "bench_torch_$mode" $st "seconds=$((SECONDS - t0))" "_=$ref" "mfu=$mfu" \
        "peak_mib=$PEAK_MIB" "mllm_params=${BPARAMS:-null}" "_=$k"
    else
      record "bench_torch_$mode" fail "log=\"$OUT/bench_torch_$mode.log\""
    fi
  done
  "${REPORT[@]}" bench-summary "$OUT" > "$OUT/bench_summary.json" &&
    record bench_summary info "_=$(cat "$OUT/bench_summary.json")" ||
    record bench_summary fail "why=\"$(cat "$OUT/bench_summary.json")\""
fi

python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(open(sys.argv[2]).read()); sys.exit(0 if r["passed"] else 1)' \
  "$OUT/report.json" "$OUT/report.md"
