#!/usr/bin/env bash
# launch/mpirun.sh: the command it prints (dry run) for a few core counts and rank counts —
# --oversubscribe only when ranks > cores, threads = cores / ranks, root variables only as root,
# --threads reaching mllm-train as train.threads — bad command lines exit 2, and a real 2-rank
# run gets the printed OMP_NUM_THREADS.
source "$(dirname "$0")/../e2e/common.sh"
M="$MLLM_SOURCE_DIR/launch/mpirun.sh"
unset OMP_NUM_THREADS MLLM_DRY_RUN

# shown ARGS...: the printed command (stderr, "+ " stripped) of a dry run; fails on exit != 0.
shown() { "$M" "$@" 2>&1 >/dev/null | sed -n 's/^+ //p'; [ "${PIPESTATUS[0]}" -eq 0 ] || fail "mpirun.sh $* exited ${PIPESTATUS[0]}"; }
ROOTVARS="OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
[ "$(id -u)" -eq 0 ] || ROOTVARS=""

got=$(MLLM_CORES=2 shown -np 4 --dry-run /b/mllm-train r.yaml x=1)
[ "$got" = "env ${ROOTVARS}OMP_NUM_THREADS=1 mpirun -np 4 --bind-to none --oversubscribe /b/mllm-train r.yaml x=1" ] \
  || fail "np 4 on 2 cores: $got"
got=$(MLLM_CORES=2 shown -np 2 --dry-run prog)
[ "$got" = "env ${ROOTVARS}OMP_NUM_THREADS=1 mpirun -np 2 --bind-to none prog" ] || fail "np 2 on 2 cores: $got"
got=$(MLLM_CORES=16 shown -np 3 --dry-run prog)
[ "$got" = "env ${ROOTVARS}OMP_NUM_THREADS=5 mpirun -np 3 --bind-to none prog" ] || fail "np 3 on 16 cores: $got"
got=$(MLLM_CORES=16 OMP_NUM_THREADS=7 shown -np 2 --dry-run prog)
[ "$got" = "env ${ROOTVARS}OMP_NUM_THREADS=7 mpirun -np 2 --bind-to none prog" ] || fail "OMP_NUM_THREADS kept: $got"
got=$(MLLM_CORES=8 shown --threads 3 -np 2 --dry-run /b/mllm-train 'a b.yaml')
[ "$got" = "env ${ROOTVARS}OMP_NUM_THREADS=3 mpirun -np 2 --bind-to none /b/mllm-train a\\ b.yaml train.threads=3" ] \
  || fail "--threads for mllm-train: $got"
got=$(MLLM_CORES=8 shown --threads 3 -np 2 --dry-run other)
[ "$got" = "env ${ROOTVARS}OMP_NUM_THREADS=3 mpirun -np 2 --bind-to none other" ] || fail "--threads for another program: $got"
got=$(MLLM_CORES=2 MLLM_DRY_RUN=1 MPIRUN=/opt/mpirun MPIRUN_EXTRA="--mca btl self" shown -np 1 prog)
[ "$got" = "env ${ROOTVARS}OMP_NUM_THREADS=2 /opt/mpirun -np 1 --bind-to none --mca btl self prog" ] \
  || fail "MPIRUN, MPIRUN_EXTRA, MLLM_DRY_RUN: $got"

# --help lists every option the parser knows, and exits 0.
help=$("$M" --help) || fail "--help exit code"
for opt in -np --threads --dry-run --help MPIRUN MPIRUN_EXTRA MLLM_CORES MLLM_DRY_RUN; do
  grep -q -- "$opt" <<< "$help" || fail "--help does not mention $opt"
done
for bad in "" "-np" "-np 0 prog" "-np x prog" "-np 2" "--bogus -np 2 prog" "-np 2 --threads 0 prog"; do
  set +e; "$M" $bad > /dev/null 2>&1; code=$?; set -e
  [ "$code" -eq 2 ] || fail "'mpirun.sh $bad' exited $code, want 2"
done

# A real run: both ranks see the OMP_NUM_THREADS it printed.
out=$(MLLM_CORES=2 "$M" -np 2 printenv OMP_NUM_THREADS 2>/dev/null) || fail "real mpirun run"
[ "$out" = $'1\n1' ] || fail "ranks saw OMP_NUM_THREADS '$out'"
echo PASS
