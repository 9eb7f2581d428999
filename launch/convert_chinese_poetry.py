#!/usr/bin/env python3
"""Converts the chinese-poetry npm package (unpacked) into one-poem-per-line .jsonl files.

Each line: {"text": title + "\n" + lines joined by "\n", "title": ..., "author": ...}.
Poems without any non-empty line are skipped; a poem without a title is just its lines.
Song ci have no title: their tune name (rhythmic) is used. Files are read in numeric order
(poet.tang.0, 1000, 2000, ...) so the output is the same on every machine.
Usage: convert_chinese_poetry.py PACKAGE_DIR OUT_DIR [--sample-only]
"""
import glob
import json
import os
import re
import sys

# output file -> glob of package files (relative to PACKAGE_DIR/dist)
FULL = {
    "tang.jsonl": "quantangshi/poet.tang.*.json",
    "song.jsonl": "quantangshi/poet.song.*.json",
    "ci.jsonl": "songci/ci.song.*.json",
}
SAMPLE = {"tang300.jsonl": "quantangshi/唐诗三百首.json"}


def numeric_key(path):
    m = re.search(r"\.(\d+)[a-z]*\.json$", path)
    return (int(m.group(1)) if m else -1, path)


def convert(package_dir, pattern, out_path):
    files = sorted(glob.glob(os.path.join(package_dir, "dist", pattern)), key=numeric_key)
    if not files:
        sys.exit(f"convert_chinese_poetry: no file matches {pattern} under {package_dir}/dist")
    poems = chars = 0
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as out:
        for f in files:
            with open(f, encoding="utf-8") as fh:
                for p in json.load(fh):
                    lines = [x.strip() for x in p.get("paragraphs", []) if x.strip()]
                    if not lines:
                        continue
                    title = (p.get("title") or p.get("rhythmic") or "").strip()
                    text = "\n".join(([title] if title else []) + lines)
                    rec = {"text": text, "title": title, "author": (p.get("author") or "").strip()}
                    out.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    poems += 1
                    chars += len(text)
    os.replace(tmp, out_path)
    print(f"{out_path}: {poems} poems, {chars} characters from {len(files)} files")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    package_dir, out_dir = sys.argv[1], sys.argv[2]
    table = SAMPLE if "--sample-only" in sys.argv[3:] else FULL
    os.makedirs(out_dir, exist_ok=True)
    for name, pattern in table.items():
        convert(package_dir, pattern, os.path.join(out_dir, name))


if __name__ == "__main__":
    main()
