#!/usr/bin/env bash
# Dependencies without root: for GPU boxes and clusters that have a compiler, CMake and PyTorch
# but no apt (or no root).
#
#   launch/deps-prefix.sh fetch DIR            on a Debian 12 machine with apt (no root needed):
#                                              downloads the project's Debian packages and the
#                                              libraries they need (~55 .deb files, ~24 MB) into DIR
#   launch/deps-prefix.sh unpack DIR PREFIX    anywhere with python3 (no root, no dpkg): unpacks
#                                              DIR/*.deb into PREFIX and writes PREFIX/env.sh
#   launch/deps-prefix.sh cmake-args PREFIX    prints the CMake arguments that build against PREFIX
#
# Then:  source PREFIX/env.sh && cmake -S . -B build $(launch/deps-prefix.sh cmake-args PREFIX)
# unpack relocates the prefix: pkg-config files say PREFIX/usr instead of /usr, Debian's
# alternatives (mpirun, mpicc, the mpi include folder, libmpi.so) are made as links, and a link
# into a package that is not fetched points at the machine's own copy (or is removed). env.sh puts
# PREFIX's programs and libraries on PATH / LD_LIBRARY_PATH / PKG_CONFIG_PATH and relocates
# OpenMPI: OPAL_PREFIX (components, help files), OPAL_SYSCONFDIR (Debian's MCA settings, which
# keep OpenMPI on ob1 + shared memory/TCP rather than libfabric) and PMIx's component path.
# pkg-config itself (pkgconf) comes with the prefix. Packages the target machine always has (libc,
# libstdc++, zlib, the compilers, Python) are not fetched.
set -euo pipefail

ROOTS=(libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libsentencepiece-dev
       zlib1g-dev libzstd-dev libsimdjson-dev libopenmpi-dev openmpi-bin libgtest-dev pkgconf)
ARCH_TRIPLET=x86_64-linux-gnu

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "deps-prefix.sh: $*" >&2; exit "${2:-1}"; }

# The Depends closure of ROOTS (first alternative of each "a | b"), without what every target
# machine has. Prints one package name per line.
resolve() {
  python3 - "${ROOTS[@]}" <<'PY'
import re, subprocess, sys
# Present on any machine that builds C++ (libc, libstdc++, GCC, binutils) or that mllm does not
# need from the prefix (Python, Perl, JavaScript docs, the Debian tooling, common system libs).
SKIP = re.compile(
    r"^(libc6|libc6-dev|libc-dev-bin|linux-libc-dev|libcrypt1|libcrypt-dev|libgcc-s1|libstdc\+\+6|"
    r"libstdc\+\+-\d+-dev|gcc(-\d+)?(-base)?|g\+\+(-\d+)?|cpp(-\d+)?|gfortran(-\d+)?|flang-.*|"
    r"libgfortran-\d+-dev|libgcc-\d+-dev|perl.*|libperl.*|python3.*|libpython3.*|libjs-.*|debconf|"
    r"dpkg|dpkg-dev|libdpkg-perl|tar|sensible-utils|lsb-base|adduser|passwd|make|patch|xz-utils|"
    r"bzip2|ca-certificates|openssh-client|libssl3|libselinux1|libsystemd0|libudev1|libzstd1|"
    r"liblzma5|libbz2-1.0|zlib1g|libtinfo6|libncursesw6|libncurses6|libgmp10|libmpfr6|libmpc3|"
    r"libisl23|binutils.*|libbinutils|libctf.*|libgprofng0|libjansson4|libsframe.*|libasan\d|"
    r"liblsan\d|libtsan\d|libubsan\d|libitm1|libatomic1|libgomp1|libquadmath0|libhwasan\d|libcc1-0|"
    r"libpam.*|libaudit.*|libsemanage.*|libcap-ng0|libsepol2|libpcre2-8-0|libmd0|libbsd0|libdb5.3|"
    r"libgdbm.*|libexpat1|libffi8|libreadline8|readline-common|libsqlite3-0|mailcap|media-types|"
    r"netbase|tzdata|libuuid1|libblkid1|libmount1|libsmartcols1|libkeyutils1|libkrb5.*|libgssapi.*|"
    r"libk5crypto3|libcom-err2|libtirpc.*|libnsl.*|libedit2|libcbor0.10|libfido2-1|libx11-6|"
    r"libx11-data|libxext6|libxcb1|libxau6|libxdmcp6)$")
seen, order, queue = set(), [], list(sys.argv[1:])
while queue:
    p = queue.pop(0)
    if p in seen or SKIP.match(p):
        continue
    seen.add(p)
    out = subprocess.run(["apt-cache", "depends", "--no-recommends", "--no-suggests",
                          "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", p],
                         capture_output=True, text=True).stdout.splitlines()
    if not out or out[0].startswith("<"):
        sys.exit(f"deps-prefix.sh: apt knows no package {p} (apt-get update?)")
    order.append(p)
    in_alternatives = False
    for line in out[1:]:
        m = re.match(r"\s+(\|)?(?:Pre)?Depends: (<?)([^>\s]+)", line)
        if not m:
            continue
        later_alternative = in_alternatives
        in_alternatives = bool(m.group(1))
        if later_alternative or m.group(2) == "<":  # "a | b": a only; a virtual name: skip
            continue
        queue.append(m.group(3))
print("\n".join(order))
PY
}

fetch() {
  local dir=$1
  command -v apt-get >/dev/null && command -v apt-cache >/dev/null ||
    die "fetch needs apt-get (run it on a Debian 12 machine, then copy DIR over)"
  mkdir -p "$dir"
  local packages
  packages=$(resolve) || exit 1
  echo "deps-prefix: downloading $(echo "$packages" | wc -l) packages into $dir"
  # shellcheck disable=SC2086
  (cd "$dir" && apt-get download -q $packages >/dev/null) ||
    die "apt-get download failed (is the package index current? apt-get update)"
  echo "$packages" > "$dir/packages.txt"
  echo "deps-prefix: $(find "$dir" -name '*.deb' | wc -l) .deb files, $(du -sh "$dir" | cut -f1)"
}

unpack() {
  local dir=$1 prefix=$2
  ls "$dir"/*.deb >/dev/null 2>&1 || die "no .deb files in $dir (run: deps-prefix.sh fetch $dir)"
  mkdir -p "$prefix"
  prefix="$(cd "$prefix" && pwd)"
  python3 - "$dir" "$prefix" <<'PY'
import glob, io, os, sys, tarfile
debs, prefix = sorted(glob.glob(os.path.join(sys.argv[1], "*.deb"))), sys.argv[2]

def members(path):
    """(name, bytes) of the ar archive a .deb is (ar(5): 8-byte magic, 60-byte headers)."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            sys.exit(f"deps-prefix.sh: {path} is not a .deb (ar) file")
        while True:
            head = f.read(60)
            if len(head) < 60:
                return
            name, size = head[:16].decode().strip().rstrip("/"), int(head[48:58].decode())
            data = f.read(size)
            if size % 2:
                f.read(1)
            yield name, data

for deb in debs:
    data = [d for n, d in members(deb) if n.startswith("data.tar")]
    if not data:
        sys.exit(f"deps-prefix.sh: {deb} has no data.tar member")
    with tarfile.open(fileobj=io.BytesIO(data[0])) as tar:
        for m in tar.getmembers():
            if m.isdev():
                continue
            # Absolute symbolic links (/etc/alternatives/..., /usr/lib/...) point into PREFIX.
            if m.issym() and m.linkname.startswith("/"):
                target = os.path.join(prefix, m.linkname.lstrip("/"))
                m.linkname = os.path.relpath(target, os.path.dirname(os.path.join(prefix, m.name)))
            # Modes matter (programs, libraries); ownership is only set when running as root.
            if hasattr(tarfile, "fully_trusted_filter"):
                tar.extract(m, prefix, filter="fully_trusted")
            else:
                tar.extract(m, prefix)
print(f"deps-prefix: unpacked {len(debs)} packages into {prefix}")
PY
  # Debian selects OpenMPI through the alternatives system (postinst scripts, which do not run
  # here): the links update-alternatives would make for the mpirun and mpi-x86_64-linux-gnu
  # groups.
  local bin="$prefix/usr/bin" lib="$prefix/usr/lib/$ARCH_TRIPLET"
  for tool in mpicc mpicxx mpic++ mpirun mpiexec ompi_info orterun; do
    [ -e "$bin/$tool.openmpi" ] && ln -sfn "$tool.openmpi" "$bin/$tool"
  done
  if [ -d "$lib/openmpi/include" ]; then
    mkdir -p "$prefix/usr/include/$ARCH_TRIPLET"
    ln -sfn "../../lib/$ARCH_TRIPLET/openmpi/include" "$prefix/usr/include/$ARCH_TRIPLET/mpi"
    ln -sfn openmpi/lib/libmpi.so "$lib/libmpi.so"
    ln -sfn openmpi/lib/libmpi_cxx.so "$lib/libmpi++.so"
    for pc in "" -c -cxx -fort; do ln -sfn "ompi$pc.pc" "$lib/pkgconfig/mpi$pc.pc"; done
  fi
  python3 - "$prefix" "$ARCH_TRIPLET" <<'PY'
import glob, os, re, subprocess, sys
prefix, triplet = sys.argv[1], sys.argv[2]
# pkg-config files: Debian's say prefix=/usr (and some name /usr/... directly). Without this,
# pkg-config hands out -I/usr/include, which it then drops as a system folder, and a library
# like sentencepiece compiles only where the machine happens to have its headers too.
path_start = re.compile(r"(?<![\w./-])/usr(?=/|\s|$)")
done = set()
for pc in glob.glob(f"{prefix}/usr/**/*.pc", recursive=True):
    real = os.path.realpath(pc)
    if real in done or not os.path.isfile(real) or not real.startswith(prefix + "/"):
        continue
    done.add(real)
    text = open(real, encoding="utf-8", errors="surrogateescape").read()
    fixed = path_start.sub(prefix + "/usr", text)
    if fixed != text:
        open(real, "w", encoding="utf-8", errors="surrogateescape").write(fixed)
# Links into packages that are not fetched (the machine has them: zlib1g for libz.so, libjs-*
# for documentation): aimed at the machine's own copy of a library, otherwise removed, so that
# nothing in the prefix dangles (CMake would skip a dangling libz.so and link libz.a instead).
system_libs = {}
try:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
        if m and "x86-64" in m.group(2):
            system_libs.setdefault(m.group(1), m.group(3))
except OSError:
    pass
for d in (f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib64", "/usr/lib64"):
    for f in glob.glob(f"{d}/lib*.so*"):
        system_libs.setdefault(os.path.basename(f), f)
relinked, removed = [], []
for root, dirs, files in os.walk(prefix):
    for name in dirs + files:
        path = os.path.join(root, name)
        if not os.path.islink(path) or os.path.exists(path):
            continue
        target = os.path.basename(os.readlink(path))
        soname = re.sub(r"^(lib.*\.so\.\d+).*$", r"\1", target)
        found = system_libs.get(target) or system_libs.get(soname)
        os.remove(path)
        if found and os.path.exists(found):
            os.symlink(found, path)
            relinked.append(f"{os.path.relpath(path, prefix)} -> {found}")
        else:
            removed.append(os.path.relpath(path, prefix))
# Libraries that CMake packages name by their full file name (zstd's targets name
# libzstd.so.1.5.4, whose package, libzstd1, every machine has and is not fetched): linked to the
# machine's copy of the same soname, so that the imported target exists.
for cfg in glob.glob(os.path.join(prefix, "usr/lib", triplet, "cmake", "*", "*Targets-*.cmake")):
    text = open(cfg, encoding="utf-8", errors="surrogateescape").read()
    for name in sorted(set(re.findall(r'\$\{_IMPORT_PREFIX\}/lib/' + re.escape(triplet) + r'/(lib[^"/\s]+\.so[.\d]*)', text))):
        path = os.path.join(prefix, "usr/lib", triplet, name)
        if os.path.lexists(path):
            continue
        soname = re.sub(r"^(lib.*\.so\.\d+).*$", r"\1", name)
        found = system_libs.get(name) or system_libs.get(soname)
        if found and os.path.exists(found):
            os.symlink(found, path)
            relinked.append(f"{os.path.relpath(path, prefix)} -> {found}")
for r in relinked:
    print(f"deps-prefix: {r} (the machine's own copy)")
if removed:
    print(f"deps-prefix: removed {len(removed)} link(s) into packages not fetched: "
          + ", ".join(removed[:4]) + (" ..." if len(removed) > 4 else ""))
PY
  local ompi="$lib/openmpi"
  cat > "$prefix/env.sh" <<ENV
# Generated by launch/deps-prefix.sh: use the dependencies unpacked in $prefix.
export PATH="$prefix/usr/bin:\$PATH"
export LD_LIBRARY_PATH="$lib:$ompi/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$lib/pkgconfig:$prefix/usr/share/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
export CMAKE_PREFIX_PATH="$prefix/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
# OpenMPI was built for /usr: its components and help files (OPAL_PREFIX), and Debian's MCA
# settings in /etc/openmpi (OPAL_SYSCONFDIR: without them it picks libfabric's TCP provider over
# ob1).
export OPAL_PREFIX="$prefix/usr"
export OPAL_SYSCONFDIR="$prefix/etc/openmpi"
# The external PMIx loads its plugins from the folder it was built for,
# /usr/lib/$ARCH_TRIPLET/pmix2/lib/pmix, whatever PMIX_MCA_mca_base_component_path says. On a
# machine with another PMIx version there (the GPU image has one) it loads that version's
# plugins into this one: on the first GPU check one failed ("undefined symbol:
# pmix_output_info") and two loaded. mllm needs none of them (compression of large start-up
# data, Slurm's remaining-time query), so PMIx loads none, and does not warn about the missing
# compression.
export PMIX_MCA_mca_base_component_disable_dlopen=1
export PMIX_MCA_pcompress_base_silence_warning=1
ENV
  echo "deps-prefix: source $prefix/env.sh, then configure with:"
  echo "  cmake -S . -B build $(cmake_args "$prefix")"
}

cmake_args() {
  local prefix=$1
  echo "-DCMAKE_PREFIX_PATH=$prefix/usr -DMPI_C_COMPILER=$prefix/usr/bin/mpicc.openmpi" \
       "-DMPI_CXX_COMPILER=$prefix/usr/bin/mpicxx.openmpi -DMPIEXEC_EXECUTABLE=$prefix/usr/bin/mpirun.openmpi"
}

case "${1:-}" in
  fetch) [ $# -eq 2 ] || { usage >&2; exit 2; }; fetch "$2" ;;
  unpack) [ $# -eq 3 ] || { usage >&2; exit 2; }; unpack "$2" "$3" ;;
  cmake-args) [ $# -eq 2 ] || { usage >&2; exit 2; }; cmake_args "$(cd "$2" && pwd)" ;;
  -h|--help) usage ;;
  *) usage >&2; exit 2 ;;
esac
