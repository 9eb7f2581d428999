#!/usr/bin/env bash
# Puts the chinese-poetry corpus (MIT) where the recipes read it: data/full/tang.jsonl (57,603
# Tang poems, one per line, checked against a pinned sha256) and, with --all, song.jsonl and
# ci.jsonl. Needs no network when the compressed Tang corpus is at hand; idempotent.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CORPUS_DIR="${CORPUS_DIR:-$ROOT/data/full}"
# sha256 of tang.jsonl as launch/convert_chinese_poetry.py writes it (16,819,136 bytes); the same
# from the npm package chinese-poetry@2.0.1 and from the git repository chinese-poetry/chinese-poetry.
TANG_SHA256=4f503fa181af641b2b43ffb1feca05c78686008c28def8582614180c99bab329
# Where tang.jsonl.xz (xz of that file, about 5.3 MB) is looked for, first to last.
case "${MLLM_CORPUS_XZ:-}" in
  "") XZ_CANDIDATES=("$ROOT/data/corpus/tang.jsonl.xz" "$ROOT/../shared/corpus/tang.jsonl.xz") ;;
  none) XZ_CANDIDATES=() ;;
  *) [ -f "$MLLM_CORPUS_XZ" ] || { echo "fetch-corpus.sh: MLLM_CORPUS_XZ=$MLLM_CORPUS_XZ: no such file" >&2; exit 2; }
     XZ_CANDIDATES=("$MLLM_CORPUS_XZ") ;;
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
  --all      also song.jsonl and ci.jsonl (the Song collections: source 2 or 3)
  --sample   also rewrite the committed sample data/tang300/ (maintainers; source 2 or 3)
Environment:
  CORPUS_DIR     output folder (now: $CORPUS_DIR)
  MLLM_CORPUS_XZ a tang.jsonl.xz to use instead of those of source 1, or 'none' to skip source 1
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
tang_ok() { [ -f "$CORPUS_DIR/tang.jsonl" ] && [ "$(sha256_of "$CORPUS_DIR/tang.jsonl")" = "$TANG_SHA256" ]; }

mkdir -p "$CORPUS_DIR"
WORK="$(mktemp -d "$CORPUS_DIR/.fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# Moves a converted/decompressed tang.jsonl into place if its sha256 is the pinned one.
install_tang() {  # FILE SOURCE-DESCRIPTION
  local got
  got="$(sha256_of "$1")"
  [ "$got" = "$TANG_SHA256" ] ||
    die "tang.jsonl from $2 has sha256 $got, expected $TANG_SHA256 (corrupt or a different version)"
  mv "$1" "$CORPUS_DIR/tang.jsonl"
  cp "$LICENSE_FILE" "$CORPUS_DIR/LICENSE"
  echo "fetch-corpus: $CORPUS_DIR/tang.jsonl from $2 (sha256 verified)"
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

# 1. Tang: the compressed copy, else the sources.
if tang_ok; then
  echo "fetch-corpus: $CORPUS_DIR/tang.jsonl present and verified"
else
  done_tang=0
  for xz_file in "${XZ_CANDIDATES[@]}"; do
    [ -f "$xz_file" ] || continue
    command -v xz >/dev/null || die "'xz' is required to read $xz_file (apt-get install xz-utils)"
    xz -dc "$xz_file" > "$WORK/tang.jsonl" || die "$xz_file: not a valid .xz file"
    install_tang "$WORK/tang.jsonl" "$xz_file"
    done_tang=1
    break
  done
  if [ $done_tang = 0 ]; then
    if [ -z "$FROM" ] && ! command -v npm >/dev/null; then
      die "no copy of the Tang corpus found and no way to fetch one. Looked for tang.jsonl.xz in:
$(printf '  %s\n' "${XZ_CANDIDATES[@]:-(nowhere: MLLM_CORPUS_XZ=none)}")
Put tang.jsonl.xz (sha256 of its content: $TANG_SHA256) in one of those places, or pass
--from DIR (the npm package chinese-poetry@$NPM_VERSION unpacked, or a git checkout of
github.com/chinese-poetry/chinese-poetry), or install npm where the npm registry is reachable."
    fi
    src="$(source_dir)"
    python3 "$CONVERTER" "$src" "$WORK" --only tang.jsonl
    install_tang "$WORK/tang.jsonl" "$src"
  fi
fi

# 2. Song collections and the committed sample: only from the sources.
if [ $ALL = 1 ] || [ $SAMPLE = 1 ]; then
  src="$(source_dir)"
  if [ $ALL = 1 ]; then
    python3 "$CONVERTER" "$src" "$WORK" --only song.jsonl ci.jsonl
    mv "$WORK/song.jsonl" "$WORK/ci.jsonl" "$CORPUS_DIR/"
    cp "$LICENSE_FILE" "$CORPUS_DIR/LICENSE"
  fi
  if [ $SAMPLE = 1 ]; then
    python3 "$CONVERTER" "$src" "$ROOT/data/tang300" --sample-only
  fi
fi
echo "fetch-corpus: done"
