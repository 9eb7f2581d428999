#!/usr/bin/env bash
# README's two set-up commands on a truly fresh Debian 12, as a new user would run them: a minbase
# bookworm made by debootstrap in DIR/rootfs, with only git, ca-certificates and sudo installed,
# /proc, /sys and /dev bound in (a private mount namespace: nothing stays mounted), a user with
# passwordless sudo, this repository's HEAD cloned into ~/work/main and the corpus's compressed
# copies beside it in ~/work/shared/corpus (as on our machines), this machine's apt sources, pip
# configuration and CA certificates copied in (Debian's mirrors and PyPI are reached through them
# here). Then command A and command B, read from README.md, each under `env -i` with a login
# shell's PATH, and C: the GPU build from NVIDIA's wheels (install-deps --cuda-wheels, a CUDA
# configure in build-cuda/, mllm-train and the NCCL probe built; nothing CUDA runs, no GPU here).
# No CUDA toolkit is in the chroot, whatever this machine has.
#
#   launch/fresh-machine-check.sh [DIR]   (default /var/tmp/mllm-fresh; as root)
#     --reuse    keep an existing DIR/rootfs (skip debootstrap and the clone); reruns A and B
#     --keep     leave DIR/rootfs after the run (~10 GB; removed by default)
#     --only A|B|C run one of them
#
# Not in CI: it downloads ~5 GB (Debian's packages, the torch wheel and its CUDA libraries) and
# takes about an hour on 2 cores. DIR/summary.md gets the times, the main job's val loss and
# ctest's verdict; DIR/A.log and DIR/B.log the whole output.
set -euo pipefail

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }
DIR=/var/tmp/mllm-fresh REUSE=0 KEEP=0 ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --reuse) REUSE=1 ;;
    --keep) KEEP=1 ;;
    --only) [ $# -ge 2 ] && [[ "$2" =~ ^[ABC]$ ]] || { echo "--only needs A, B or C" >&2; exit 2; }
            ONLY=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "fresh-machine-check.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) DIR=$1 ;;
  esac
  shift
done
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ "$(id -u)" -eq 0 ] || { echo "fresh-machine-check.sh: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
FS="$DIR/rootfs"
USER_NAME=mllm
HOME_IN=/home/$USER_NAME
say() { echo "fresh-machine-check: $*" | tee -a "$DIR/summary.log"; }

# The README's commands, as a user copies them: the first line of the fenced block after the
# "**A —" and "**B —" paragraphs.
readme_command() {
  awk -v tag="**$1 —" 'index($0, tag) == 1 { found = 1; next }
                       found && /^```/ { inblock = !inblock; if (!inblock) exit; next }
                       found && inblock { print; exit }' "$ROOT/README.md"
}
CMD_A=$(readme_command A)
CMD_B=$(readme_command B)
CMD_C="launch/install-deps.sh --cuda-wheels && cmake -S . -B build-cuda -DMLLM_WITH_CUDA=ON \
-DMLLM_WITH_NCCL=ON -DMLLM_BUILD_TESTS=OFF -DMLLM_BUILD_BENCH=OFF && cmake --build build-cuda -j\$(nproc) \
--target mllm-train mllm_nccl_probe && ldd build-cuda/bin/mllm-train | grep -E 'libtorch_cuda|libnccl'"
[ -n "$CMD_A" ] && [ -n "$CMD_B" ] || { echo "fresh-machine-check.sh: README.md's commands A and B not found" >&2; exit 1; }

# ---- the fresh system ------------------------------------------------------------------------
if [ "$REUSE" -eq 0 ] || [ ! -x "$FS/bin/bash" ]; then
  rm -rf "$FS"
  : > "$DIR/summary.log"
  command -v debootstrap > /dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
  # This machine's Debian mirror (the first http(s) URI of its sources), else Debian's own.
  mirror=$(grep -h -o -E 'https?://[^ ]*/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
             /etc/apt/sources.list.d/*.list 2> /dev/null | head -1 | tr -d ' ' || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  t0=$SECONDS
  debootstrap --variant=minbase bookworm "$FS" "$mirror" > "$DIR/debootstrap.log" 2>&1 ||
    { tail -20 "$DIR/debootstrap.log"; exit 1; }
  say "debootstrap minbase bookworm from $mirror: $((SECONDS - t0)) s"
  # Network settings of this machine: name resolution, apt sources and their Acquire:: options,
  # CA certificates (a proxy's included), pip's configuration.
  cp /etc/resolv.conf /etc/hosts /etc/hostname "$FS/etc/"
  rm -f "$FS/etc/apt/sources.list"   # debootstrap's; this machine's sources replace it
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] && cp "$f" "$FS$f"
  done
  for f in /etc/apt/apt.conf.d/*; do
    grep -q "Acquire::" "$f" 2> /dev/null && cp "$f" "$FS$f"
  done
  mkdir -p "$FS/usr/local/share/ca-certificates"
  cp -r /usr/local/share/ca-certificates/. "$FS/usr/local/share/ca-certificates/" 2> /dev/null || true
  [ -f /etc/pip.conf ] && cp /etc/pip.conf "$FS/etc/pip.conf"
  chroot "$FS" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends git ca-certificates sudo &&
           update-ca-certificates' > "$DIR/base.log" 2>&1 || { tail -20 "$DIR/base.log"; exit 1; }
  chroot "$FS" useradd -m -s /bin/bash "$USER_NAME"
  for f in "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; do
    [ -f "$f" ] && mkdir -p "$FS$HOME_IN/.config/pip" && cp "$f" "$FS$HOME_IN/.config/pip/pip.conf"
  done
  echo "$USER_NAME ALL=(ALL) NOPASSWD:ALL" > "$FS/etc/sudoers.d/$USER_NAME"
  chmod 440 "$FS/etc/sudoers.d/$USER_NAME"
  git clone -q "$ROOT" "$FS$HOME_IN/work/main"
  mkdir -p "$FS$HOME_IN/work/shared/corpus"
  for f in tang.jsonl.xz README.md LICENSE; do
    [ -f "$ROOT/../shared/corpus/$f" ] && cp "$ROOT/../shared/corpus/$f" "$FS$HOME_IN/work/shared/corpus/"
  done
  chroot "$FS" chown -R "$USER_NAME:$USER_NAME" "$HOME_IN"
  say "base system: $(chroot "$FS" dpkg-query -W -f='.\n' | wc -l) packages, $(du -sh "$FS" | cut -f1);" \
      "clone of $(git -C "$ROOT" rev-parse --short HEAD)"
fi
if [ "$REUSE" -eq 1 ]; then
  g=(git -c safe.directory="*" -C "$FS$HOME_IN/work/main")
  "${g[@]}" fetch -q "$ROOT" HEAD && "${g[@]}" reset -q --hard FETCH_HEAD
  chroot "$FS" chown -R "$USER_NAME:$USER_NAME" "$HOME_IN/work/main"
  say "reused $FS; its clone is at $(git -C "$ROOT" rev-parse --short HEAD)"
fi
! [ -e "$FS/usr/local/cuda" ] && ! chroot "$FS" sh -c 'command -v nvcc' > /dev/null ||
  { echo "fresh-machine-check.sh: the chroot has a CUDA toolkit" >&2; exit 1; }

# ---- A and B, as the user, in a private mount namespace ---------------------------------------
run_in_chroot() {  # NAME COMMAND
  local name=$1 cmd=$2 t0=$SECONDS rc=0
  say "$name: $cmd"
  unshare -m --propagation private bash -c '
    set -e
    FS=$1
    mount -t proc proc "$FS/proc"
    mount --rbind /sys "$FS/sys"
    mount --rbind /dev "$FS/dev"
    exec chroot --userspec=$2:$2 "$FS" env -i HOME=$3 USER=$2 LOGNAME=$2 SHELL=/bin/bash LANG=C.UTF-8 \
      PATH=/usr/local/bin:/usr/bin:/bin bash -c "cd \$HOME/work/main && $4"' \
    _ "$FS" "$USER_NAME" "$HOME_IN" "$cmd" > "$DIR/$name.log" 2>&1 || rc=$?
  say "$name: exit $rc after $(( (SECONDS - t0) / 60 ))m$(( (SECONDS - t0) % 60 ))s (log: $DIR/$name.log)"
  return "$rc"
}
rc_a=skipped rc_b=skipped
if [ -z "$ONLY" ] || [ "$ONLY" = A ]; then
  rc_a=0; run_in_chroot A "$CMD_A" || rc_a=$?
  metrics="$FS$HOME_IN/work/main/runs/mini/metrics.jsonl"
  if [ -f "$metrics" ]; then
    val=$(python3 - "$metrics" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
vals = [r for r in rows if "val_loss" in r]
print(f"val loss {vals[-1]['val_loss']:.4f} at step {vals[-1]['step']}" if vals else "no evaluation")
PY
)
    say "A: main job: $val"
  fi
  grep -E "^-- mllm: build:" "$DIR/A.log" | sed 's/^-- /A: /' | tee -a "$DIR/summary.log" || true
fi
if [ -z "$ONLY" ] || [ "$ONLY" = B ]; then
  rc_b=0; run_in_chroot B "$CMD_B" || rc_b=$?
  grep -E "tests passed|tests failed out of|The following tests" "$DIR/B.log" | sed 's/^/B: /' | tee -a "$DIR/summary.log" || true
  grep -E "\(Failed\)|\(Timeout\)|Not Run|\*\*\*Skipped|Skipped" "$DIR/B.log" | sed 's/^/B:   /' | tee -a "$DIR/summary.log" || true
fi
rc_c=skipped
if [ -z "$ONLY" ] || [ "$ONLY" = C ]; then
  rc_c=0; run_in_chroot C "$CMD_C" || rc_c=$?
  grep -E "^-- mllm: (build|nccl)" "$DIR/C.log" | sed 's/^-- /C: /' | tee -a "$DIR/summary.log" || true
fi
say "du: .venv $(du -sh "$FS$HOME_IN/work/main/.venv" 2> /dev/null | cut -f1), build $(du -sh "$FS$HOME_IN/work/main/build" 2> /dev/null | cut -f1), rootfs $(du -sh "$FS" | cut -f1)"
mv "$DIR/summary.log" "$DIR/summary.md"
[ "$KEEP" -eq 1 ] || { rm -rf "$FS"; echo "fresh-machine-check: removed $FS (--keep keeps it)"; }
[ "$rc_a" = 0 ] || [ "$rc_a" = skipped ] || exit 1
[ "$rc_b" = 0 ] || [ "$rc_b" = skipped ] || exit 1
[ "$rc_c" = 0 ] || [ "$rc_c" = skipped ] || exit 1
