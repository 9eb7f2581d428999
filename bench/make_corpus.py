#!/usr/bin/env python3
"""A synthetic multi-file corpus of a given size from the poetry corpora, in every format
mllm-prepare reads: for bench/prepare_bench.sh and the preparation tests.

    bench/make_corpus.py OUT_DIR --bytes N [--files K] [--formats jsonl,jsonl.gz,...]
                         [--source FILE.jsonl ...] [--parquet-row-group-rows R]

Writes K files (default: one per format, more when N is large) named part-NNNN.<format>,
cycling through the formats, each holding about N / K bytes of uncompressed JSON lines (or text
lines for .txt). Documents are the source poems, copy c of the sources prefixed with "c " so
that copies differ (the val split and the tokenizer sample see distinct texts). Formats:
jsonl, txt, jsonl.gz, txt.gz (zlib level 1), jsonl.zst, txt.zst (the zstd program, level 1),
parquet (pyarrow, column "text" plus "title"; row groups of --parquet-row-group-rows rows).
Standard-library Python but for parquet (pyarrow) and .zst (the zstd program).
Prints one line per file: name, bytes on disk, documents.
"""
import argparse
import gzip
import json
import os
import subprocess
import sys

FORMATS = ["jsonl", "txt", "jsonl.gz", "txt.gz", "jsonl.zst", "txt.zst", "parquet"]


def source_poems(paths):
    poems = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    o = json.loads(line)
                    poems.append((o["text"], o.get("title", "")))
    if not poems:
        sys.exit("make_corpus: the sources hold no poem")
    return poems


class Documents:
    """An endless stream of (text, title): copy c of the sources, each text prefixed "c "."""

    def __init__(self, poems):
        self.poems, self.copy, self.i = poems, 0, 0

    def next(self):
        text, title = self.poems[self.i]
        out = (f"{self.copy} {text}", title)
        self.i += 1
        if self.i == len(self.poems):
            self.i, self.copy = 0, self.copy + 1
        return out


def lines_for(fmt, docs, target):
    """Encoded lines of about `target` bytes (jsonl: one object per line; txt: the text with its
    newlines replaced by spaces, one document per line)."""
    out, size, n = [], 0, 0
    while size < target:
        text, title = docs.next()
        if fmt.startswith("jsonl"):
            b = (json.dumps({"text": text, "title": title}, ensure_ascii=False) + "\n").encode()
        else:
            b = (text.replace("\n", " ") + "\n").encode()
        out.append(b)
        size += len(b)
        n += 1
        if len(out) >= 65536:
            yield b"".join(out), n
            out, n = [], 0
    if out:
        yield b"".join(out), n


def write_file(path, fmt, docs, target, row_group_rows):
    n = 0
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        writer = None
        texts, titles, size = [], [], 0
        def flush():
            nonlocal writer, texts, titles
            if not texts:
                return
            table = pa.table({"text": pa.array(texts, pa.string()), "title": pa.array(titles, pa.string())})
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, compression="zstd")
            writer.write_table(table, row_group_size=row_group_rows)
            texts, titles = [], []
        while size < target:
            text, title = docs.next()
            texts.append(text)
            titles.append(title)
            size += len(text.encode()) + len(title.encode()) + 30
            n += 1
            if len(texts) >= row_group_rows:
                flush()
        flush()
        writer.close()
        return n
    base = fmt.split(".")[0]
    if fmt.endswith(".gz"):
        with gzip.open(path, "wb", compresslevel=1) as f:
            for block, k in lines_for(base, docs, target):
                f.write(block)
                n += k
    elif fmt.endswith(".zst"):
        with subprocess.Popen(["zstd", "-q", "-1", "-T2", "-f", "-o", path], stdin=subprocess.PIPE) as z:
            for block, k in lines_for(base, docs, target):
                z.stdin.write(block)
                n += k
            z.stdin.close()
            if z.wait() != 0:
                sys.exit("make_corpus: zstd failed")
    else:
        with open(path, "wb") as f:
            for block, k in lines_for(base, docs, target):
                f.write(block)
                n += k
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--bytes", type=float, required=True, help="total uncompressed bytes (1e9 = 1 GB)")
    ap.add_argument("--files", type=int, default=0, help="number of files (0: one per format, "
                    "or one per 512 MB when that is more)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma list of " + ", ".join(FORMATS))
    ap.add_argument("--source", nargs="+", help="source .jsonl files (default: data/full/*.jsonl, "
                    "else data/tang300/tang300.jsonl)")
    ap.add_argument("--parquet-row-group-rows", type=int, default=20000)
    a = ap.parse_args()
    formats = a.formats.split(",")
    for f in formats:
        if f not in FORMATS:
            sys.exit(f"make_corpus: unknown format {f!r}; known: {', '.join(FORMATS)}")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not a.source:
        full = [os.path.join(root, "data/full", n) for n in ("tang.jsonl", "song.jsonl", "ci.jsonl")]
        a.source = [p for p in full if os.path.exists(p)] or [os.path.join(root, "data/tang300/tang300.jsonl")]
    files = a.files or max(len(formats), int(a.bytes // 512e6))
    os.makedirs(a.out_dir, exist_ok=True)
    docs = Documents(source_poems(a.source))
    for i in range(files):
        fmt = formats[i % len(formats)]
        path = os.path.join(a.out_dir, f"part-{i:04d}.{fmt}")
        n = write_file(path, fmt, docs, a.bytes / files, a.parquet_row_group_rows)
        print(f"{os.path.basename(path)} {os.path.getsize(path)} {n}", flush=True)


if __name__ == "__main__":
    main()
