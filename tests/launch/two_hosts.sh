#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair (10.77.0.1 and
# 10.77.0.2), each with its own hostname (UTS namespace). mpirun runs on the first, starts the
# second's daemon through an rsh agent (`ip netns exec`, standing in for ssh) and the ranks talk
# over TCP only (btl tcp,self: no shared memory between them). The tiny recipe trained with one
# rank per host must give bitwise the losses of a single-host `mpirun -np 2`, and the veth must
# have carried at least the gradient all-reduce traffic. docs/multinode.md shows the same launch
# on real hosts. Skipped (77) without root or `ip netns`.
source "$(dirname "$0")/../e2e/common.sh"
[ "$(id -u)" -eq 0 ] || { echo "SKIP: network namespaces need root; this is uid $(id -u)"; exit 77; }
command -v ip >/dev/null || { echo "SKIP: no ip command (Debian's iproute2)"; exit 77; }
command -v unshare >/dev/null || { echo "SKIP: no unshare (util-linux)"; exit 77; }
NS1=mllm-h1-$$ NS2=mllm-h2-$$ VETH1=mllma$$ VETH2=mllmb$$
teardown() {
  local code=$?
  ip netns pids "$NS1" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns pids "$NS2" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns del "$NS1" 2>/dev/null || true
  ip netns del "$NS2" 2>/dev/null || true   # deleting a namespace deletes its end of the veth
  cleanup
  exit "$code"
}
trap teardown EXIT
if ! ip netns add "$NS1" 2>"$WORK/netns.err"; then
  echo "SKIP: cannot create a network namespace here: $(cat "$WORK/netns.err")"; exit 77
fi
ip netns exec "$NS1" true 2>"$WORK/netns.err" ||
  { echo "SKIP: cannot enter a network namespace here: $(cat "$WORK/netns.err")"; exit 77; }
ip netns add "$NS2"
ip link add "$VETH1" type veth peer name "$VETH2"
ip link set "$VETH1" netns "$NS1"
ip link set "$VETH2" netns "$NS2"
ip -n "$NS1" addr add 10.77.0.1/24 dev "$VETH1"
ip -n "$NS2" addr add 10.77.0.2/24 dev "$VETH2"
for ns in "$NS1" "$NS2"; do ip -n "$ns" link set lo up; done
ip -n "$NS1" link set "$VETH1" up
ip -n "$NS2" link set "$VETH2" up

# The rsh agent mpirun uses to start its daemon on a host: like `ssh HOST CMD...`, the command
# words are joined and run by a shell, here inside that host's namespaces.
cat > "$WORK/netns-rsh" <<EOF
#!/usr/bin/env bash
while [[ "\$1" == -* ]]; do shift; done      # ssh-style options, if any
host=\$1; shift
case "\$host" in
  10.77.0.1|host1) ns=$NS1 name=host1 ;;
  10.77.0.2|host2) ns=$NS2 name=host2 ;;
  *) echo "netns-rsh: unknown host '\$host'" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c "hostname \$name && exec \$*"
EOF
chmod +x "$WORK/netns-rsh"
printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' > "$WORK/hostfile"
MPI_NET=(--hostfile "$WORK/hostfile" -np 2 --map-by node --bind-to none
         --mca plm_rsh_agent "$WORK/netns-rsh"
         --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24)
# on_host1 CMD...: runs CMD as if logged in on host1 (its namespaces, its hostname).
on_host1() { ip netns exec "$NS1" unshare --uts /bin/sh -c 'hostname host1 && exec "$@"' sh "$@"; }

# Each rank on its own host, and the hosts are who they say they are.
# Every mpirun is bounded (timeout): a TCP start-up hang ends with the teardown, not with
# ctest's SIGKILL, which would skip the EXIT trap and leave the namespaces behind.
on_host1 timeout 60 mpirun "${MPI_NET[@]}" /bin/sh -c 'echo "$OMPI_COMM_WORLD_RANK $(hostname) $(ip -4 -o addr show | grep -o "10\.77\.0\.[12]")"' \
  > "$WORK/where" 2>&1 || { cat "$WORK/where" >&2; fail "mpirun across the two hosts"; }
diff <(sort "$WORK/where") <(printf '0 host1 10.77.0.1\n1 host2 10.77.0.2\n') ||
  fail "ranks not one per host: $(cat "$WORK/where")"

bytes() { ip -n "$NS1" -s -j link show "$VETH1" | python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["stats64"]; print(s["rx"]["bytes"] + s["tx"]["bytes"])'; }
B0=$(bytes)
STEPS=30
T=(train.max_steps=$STEPS checkpoint.every_steps=0 eval.every_steps=10)
on_host1 timeout 180 mpirun "${MPI_NET[@]}" -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
  "$MLLM_BIN/mllm-train" "$RECIPE" "run.out_dir=$WORK/net" "data.cache_dir=$CACHE" "data.corpus=[$CORPUS]" \
  dist.backend=mpi "${T[@]}" > "$WORK/net.log" 2>&1 || { tail -n 30 "$WORK/net.log" >&2; fail "training across the two hosts"; }
B1=$(bytes)
grep -q "world size 2" "$WORK/net/logs/rank_00.log" || fail "the run across the hosts is not world size 2"

# The same recipe on one host, shared memory allowed.
timeout 180 mpirun -np 2 --bind-to none "$MLLM_BIN/mllm-train" "$RECIPE" "run.out_dir=$WORK/local" \
  "data.cache_dir=$CACHE" "data.corpus=[$CORPUS]" dist.backend=mpi "${T[@]}" > "$WORK/local.log" 2>&1 || { cat "$WORK/local.log" >&2; fail "single-host run"; }
field "$WORK/net/metrics.jsonl" loss > "$WORK/net.loss"
field "$WORK/local/metrics.jsonl" loss > "$WORK/local.loss"
[ "$(wc -l < "$WORK/net.loss")" -eq "$STEPS" ] || fail "the two-host run logged $(wc -l < "$WORK/net.loss") steps, want $STEPS"
diff "$WORK/net.loss" "$WORK/local.loss" > "$WORK/loss.diff" || { head -n 5 "$WORK/loss.diff" >&2; fail "losses differ between two hosts and one"; }
field "$WORK/net/metrics.jsonl" grad_norm > "$WORK/net.gn"
field "$WORK/local/metrics.jsonl" grad_norm > "$WORK/local.gn"
diff -q "$WORK/net.gn" "$WORK/local.gn" > /dev/null || fail "gradient norms differ between two hosts and one"

# The gradients crossed the veth: each step all-reduces every fp32 gradient, and a ring
# all-reduce sends 2 (N-1)/N x 4 bytes x parameters = 4 x parameters bytes per step and rank at
# N = 2; the veth end counts both directions (rx + tx), so at least 8 x parameters per step.
PARAMS=$(sed -n 's/.*model [a-z0-9_]*: \([0-9]*\) parameters.*/\1/p' "$WORK/net/logs/rank_00.log" | head -n 1)
[ -n "$PARAMS" ] || fail "no parameter count in the log"
MOVED=$(( B1 - B0 ))
WANT=$(( 8 * PARAMS * STEPS ))
[ "$MOVED" -ge "$WANT" ] || fail "the veth carried $MOVED bytes, less than the all-reduce's $WANT"
echo "two_hosts: $STEPS steps, losses equal to one host; veth carried $MOVED bytes ($WANT from gradients at least)"
echo PASS
