#!/usr/bin/env python3
"""Converts the chinese-poetry corpus into one-poem-per-line .jsonl files.

SOURCE_DIR is either the npm package chinese-poetry@2.0.1 unpacked (files under dist/) or a git
checkout of github.com/chinese-poetry/chinese-poetry (files under 全唐诗/ and 宋词/); both
give the same poems.

Each line: {"text": title + "\n" + lines joined by "\n", "title": ..., "author": ...}.
Poems without any non-empty line are skipped; a poem without a title is just its lines.
Song ci have no title: their tune name (rhythmic) is used. Files are read in numeric order
(poet.tang.0, 1000, 2000, ...) so the output is the same on every machine.
Usage: convert_chinese_poetry.py SOURCE_DIR OUT_DIR [--sample-only] [--only NAME.jsonl ...]
"""
import glob
import json
import os
import re
import sys

# output file -> glob of source files (relative to the folder of the layout)
FULL = {
    "tang.jsonl": "{shi}/poet.tang.*.json",
    "song.jsonl": "{shi}/poet.song.*.json",
    "ci.jsonl": "{ci}/ci.song.*.json",
}
SAMPLE = {"tang300.jsonl": "{shi}/唐诗三百首.json"}
# layout -> (folder under SOURCE_DIR, name of the shi folder, name of the ci folder)
LAYOUTS = {"npm": ("dist", "quantangshi", "songci"), "git": ("", "全唐诗", "宋词")}


def layout_of(source_dir):
    for name, (base, shi, ci) in LAYOUTS.items():
        if os.path.isdir(os.path.join(source_dir, base, shi)):
            return os.path.join(source_dir, base), {"shi": shi, "ci": ci}
    sys.exit(f"convert_chinese_poetry: {source_dir} is neither the npm package (dist/quantangshi/) "
             "nor a git checkout (全唐诗/) of chinese-poetry")


def numeric_key(path):
    m = re.search(r"\.(\d+)[a-z]*\.json$", path)
    return (int(m.group(1)) if m else -1, path)


def convert(base_dir, pattern, out_path):
    files = sorted(glob.glob(os.path.join(base_dir, pattern)), key=numeric_key)
    if not files:
        sys.exit(f"convert_chinese_poetry: no file matches {pattern} under {base_dir}")
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
    source_dir, out_dir, opts = sys.argv[1], sys.argv[2], sys.argv[3:]
    table = SAMPLE if "--sample-only" in opts else FULL
    if "--only" in opts:
        only = opts[opts.index("--only") + 1:]
        unknown = [n for n in only if n not in table]
        if not only or unknown:
            sys.exit(f"convert_chinese_poetry: --only takes some of {', '.join(table)}")
        table = {n: table[n] for n in only}
    base_dir, folders = layout_of(source_dir)
    os.makedirs(out_dir, exist_ok=True)
    for name, pattern in table.items():
        convert(base_dir, pattern.format(**folders), os.path.join(out_dir, name))


if __name__ == "__main__":
    main()
