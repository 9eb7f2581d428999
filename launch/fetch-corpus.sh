#!/usr/bin/env bash
# Fetches the chinese-poetry corpus (npm package, MIT) with `npm pack`, checks its pinned sha512
# integrity, and converts it to one-poem-per-line .jsonl under data/full/ (tang, song, ci).
# Idempotent: a verified tarball and up-to-date .jsonl files are kept.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CORPUS_DIR="${CORPUS_DIR:-$ROOT/data/full}"
CORPUS_PACKAGE=chinese-poetry
CORPUS_VERSION=2.0.1
# From `npm view chinese-poetry@2.0.1 dist.integrity`; a different tarball is refused.
CORPUS_INTEGRITY="sha512-KtYARvV7CWNtax0na9+Jn6PlhGgSoid7PWyDzXI4KsCEm2odZcqEQyval5koaLygZnM/EQ3lfJ//25K8p3uHNg=="

usage() {
  cat <<USAGE
Usage: launch/fetch-corpus.sh [--sample] [-h|--help]
  Downloads $CORPUS_PACKAGE@$CORPUS_VERSION (npm pack), checks its sha512 integrity, and writes
  tang.jsonl, song.jsonl and ci.jsonl (one poem per line) into CORPUS_DIR. Safe to re-run.
  --sample   also rewrite the committed sample data/tang300/ (maintainers only)
Environment:
  CORPUS_DIR   where the tarball and .jsonl files go (now: $CORPUS_DIR)
USAGE
}

SAMPLE=0
for arg in "$@"; do
  case "$arg" in
    --sample) SAMPLE=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fetch-corpus.sh: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

for tool in npm python3 openssl tar base64; do
  command -v "$tool" >/dev/null || { echo "fetch-corpus.sh: '$tool' is required" >&2; exit 1; }
done

TARBALL="$CORPUS_DIR/$CORPUS_PACKAGE-$CORPUS_VERSION.tgz"
integrity_of() { echo "sha512-$(openssl dgst -sha512 -binary "$1" | base64 -w0)"; }

mkdir -p "$CORPUS_DIR"
if [[ -f "$TARBALL" && "$(integrity_of "$TARBALL")" == "$CORPUS_INTEGRITY" ]]; then
  echo "fetch-corpus: $TARBALL present and verified"
else
  rm -f "$TARBALL"
  DL="$(mktemp -d "$CORPUS_DIR/.download.XXXXXX")"
  trap 'rm -rf "$DL"' EXIT
  echo "fetch-corpus: npm pack $CORPUS_PACKAGE@$CORPUS_VERSION"
  (cd "$DL" && npm pack --silent "$CORPUS_PACKAGE@$CORPUS_VERSION" >/dev/null)
  got="$(integrity_of "$DL/$CORPUS_PACKAGE-$CORPUS_VERSION.tgz")"
  if [[ "$got" != "$CORPUS_INTEGRITY" ]]; then
    echo "fetch-corpus: integrity mismatch for $CORPUS_PACKAGE@$CORPUS_VERSION" >&2
    echo "  expected $CORPUS_INTEGRITY" >&2
    echo "  got      $got" >&2
    exit 1
  fi
  mv "$DL/$CORPUS_PACKAGE-$CORPUS_VERSION.tgz" "$TARBALL"
  rm -rf "$DL"
  trap - EXIT
fi

# The .jsonl files are rebuilt when missing or older than the tarball or the converter.
CONVERTER="$ROOT/launch/convert_chinese_poetry.py"
STAMP="$CORPUS_DIR/.converted"
if [[ -f "$STAMP" && "$STAMP" -nt "$TARBALL" && "$STAMP" -nt "$CONVERTER" && $SAMPLE == 0 ]] &&
   [[ -f "$CORPUS_DIR/tang.jsonl" && -f "$CORPUS_DIR/song.jsonl" && -f "$CORPUS_DIR/ci.jsonl" ]]; then
  echo "fetch-corpus: $CORPUS_DIR/{tang,song,ci}.jsonl up to date"
  exit 0
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/mllm-corpus.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
tar -xzf "$TARBALL" -C "$WORK"
python3 "$CONVERTER" "$WORK/package" "$CORPUS_DIR"
cp "$WORK/package/LICENSE" "$CORPUS_DIR/LICENSE"
if [[ $SAMPLE == 1 ]]; then
  python3 "$CONVERTER" "$WORK/package" "$ROOT/data/tang300" --sample-only
  cp "$WORK/package/LICENSE" "$ROOT/data/tang300/LICENSE"
fi
touch "$STAMP"
echo "fetch-corpus: done"
