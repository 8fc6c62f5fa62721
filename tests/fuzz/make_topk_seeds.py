#!/usr/bin/python3
"""Writes the sparse (CODEC_TOPK) seeds of the push fuzzer's corpus (tests/fuzz/push_fuzzer.cc, issue 30 item 6).

    make_topk_seeds.py [--corpus tests/fuzz/corpus]

The fuzzer's tiny model (its tensor names, shapes, fingerprint and push header) is read from the corpus's valid-fp32
seed (written by push_fuzzer with DILOCO_FUZZ_WRITE_SEEDS); the top-k chunks are encoded by
tests/golden/topk_reference.py with blocks of 8 keeping 2 and 64 elements a chunk, so every tensor has several blocks
and the decoder's checks all run. Seeds: valid-topk, topk-and-int8 (two workers, two codecs), topk-truncated (half the
chunks, then end: refused), topk-broken-then-valid. Needs protoc (the messages are generated into a temporary
directory) and numpy.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK, KEEP, ELEMENTS = 8, 2, 64


def records(data):
    """[(op, payload)] of a fuzzer input: [op: 1 byte][length: 2 bytes little endian][payload]."""
    out, i = [], 0
    while i + 3 <= len(data):
        n = data[i + 1] | (data[i + 2] << 8)
        out.append((data[i], data[i + 3:i + 3 + n]))
        i += 3 + n
    return out


def record(op, payload):
    return bytes([op, len(payload) & 0xFF, len(payload) >> 8]) + payload


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default=os.path.join(HERE, "corpus"))
    args = p.parse_args()
    source = os.path.dirname(os.path.dirname(HERE))
    gen = tempfile.mkdtemp()
    subprocess.run(["protoc", "-I", os.path.join(source, "proto"), "--python_out", gen,
                    os.path.join(source, "proto", "diloco.proto")], check=True)
    sys.path[:0] = [gen, os.path.join(source, "tests", "golden")]
    import diloco_pb2 as pb
    import topk_reference as ref

    seed = [(op, pb.PushMessage.FromString(m)) for op, m in records(open(os.path.join(args.corpus, "valid-fp32"),
                                                                          "rb").read()) if op % 3 == 0]
    header, layout = seed[0][1], []
    for _, m in seed[1:]:
        if not layout or layout[-1][0] != m.chunk.name:
            layout.append((m.chunk.name, m.chunk.dtype, list(m.chunk.shape)))

    def push(worker, tokens, rng_seed, keep=None, end=True, codec="topk"):
        rng = np.random.default_rng(rng_seed)
        h = pb.PushMessage()
        h.CopyFrom(header)
        h.header.meta.worker_id = worker
        h.header.tokens = tokens
        chunks = []
        for name, dtype, shape in layout:
            x = (rng.standard_normal(int(np.prod(shape))) * 0.01).astype(np.float32)
            for off in range(0, x.size, ELEMENTS):
                part = x[off:off + ELEMENTS]
                c = pb.TensorChunk(name=name, dtype=dtype, shape=shape, offset=off, count=part.size)
                if codec == "topk":
                    c.codec, c.topk_chunk, c.topk_keep = pb.CODEC_TOPK, BLOCK, KEEP
                    c.data = ref.encode(part, BLOCK, KEEP)[0]
                else:
                    lo, hi = part.min(), part.max()
                    scale = np.float32((hi - lo) / 255)
                    c.codec, c.scale, c.lo = pb.CODEC_INT8, float(scale), float(lo)
                    c.data = np.clip(np.round((part - lo) / scale), 0, 255).astype(np.uint8).tobytes()
                chunks.append(pb.PushMessage(chunk=c))
        chunks = chunks if keep is None else chunks[:keep]
        out = record(0, h.SerializeToString()) + b"".join(record(0, c.SerializeToString()) for c in chunks)
        return out + (record(1, b"") if end else b""), len(chunks)

    valid, n = push("w0", 100, 21)
    seeds = {
        "valid-topk": valid,
        "topk-and-int8": push("w0", 300, 22)[0] + push("w1", 100, 23, codec="int8")[0],
        "topk-truncated": push("w0", 100, 24, keep=n // 2)[0],
        "topk-broken-then-valid": push("w0", 100, 25, keep=n // 2, end=False)[0] + record(2, b"") +
        push("w1", 100, 26)[0],
    }
    for name, data in seeds.items():
        with open(os.path.join(args.corpus, name), "wb") as f:
            f.write(data)
        print(f"seed {name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
