#!/usr/bin/env python3
"""Reference of the sparse top-k codec (comm.codec topk), written from the SparseLoCo paper's description
(Sarfi et al., "Communication Efficient LLM Pre-training with SparseLoCo", arXiv 2508.15706), in numpy only, so
that it shares no code with the C++ implementation (proto/topk_codec.h) it checks.

SparseLoCo, per worker, each round, on the flat pseudo-gradient delta of every tensor:
    e <- beta * e + delta                        # error-feedback accumulator (beta = comm.error_decay)
    sent = Q(TopK_chunk(e))                      # per chunk of B elements, keep the k largest |e|; 2-bit values
    e <- e - sent                                # what was not sent stays for the next round

Choices the paper leaves open, fixed here and in proto/PROTOCOL.md (the wire format):
  * chunks start at element 0 of each tensor; the last one may be shorter; it keeps min(k, its length) values;
  * ties in |e| keep the lower position (a total order, so the kept set is unique);
  * 2-bit values are sign + magnitude: bit 0 the sign (1 = negative), bit 1 which of two per-chunk magnitude levels.
    The kept values are the chunk's largest magnitudes, so they cluster at both signs away from zero; an affine
    4-level grid over [min, max] spends two of its levels near zero where no kept value lies, sign + magnitude spends
    them all on |e| in [m_min, m_max]. Levels: r0 = m_min + (m_max - m_min) / 4, r1 = m_max - (m_max - m_min) / 4
    (the centres of the two halves of [m_min, m_max]), each rounded to bfloat16 (round to nearest even) as they
    travel; a value takes r1 when |e| > (r0 + r1) / 2, else r0;
  * positions inside the chunk in ceil(log2 B) bits each (12 for B = 4096), ascending.
Payload of one wire chunk of n elements (its blocks j = 0.. of B elements): every block's (r0, r1) as two little-
endian bfloat16; then every kept position as a little-endian bit stream of P bits each; then every 2-bit code, four
to a byte, low bits first.

Usable as a module (encode, decode, step) and as a script:
    topk_reference.py --out DIR     writes the golden cases the C++ test reads (tests/unit/topk_golden_test.cc)
    topk_reference.py --gaps FILE   position bits on a real pseudo-gradient: fixed P-bit vs Rice-coded gaps
"""
import argparse
import math
import os
import sys

import numpy as np


def bf16_round(x):
    """float32 -> nearest bfloat16 (ties to even), returned as float32; and its 16 bits."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    bits = u.astype(np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32), bits


def position_bits(block):
    return max(1, math.ceil(math.log2(block)))


def pack_bits(values, width):
    """Little-endian bit stream: value i occupies bits [i * width, (i + 1) * width)."""
    nbits = len(values) * width
    out = np.zeros((nbits + 7) // 8, dtype=np.uint8)
    for i, v in enumerate(values):
        for b in range(width):
            if (int(v) >> b) & 1:
                bit = i * width + b
                out[bit // 8] |= 1 << (bit % 8)
    return out


def unpack_bits(data, count, width):
    vals = []
    for i in range(count):
        v = 0
        for b in range(width):
            bit = i * width + b
            v |= ((int(data[bit // 8]) >> (bit % 8)) & 1) << b
        vals.append(v)
    return vals


def select(block_values, k):
    """Positions of the k largest |x| (ties: lower position first), ascending."""
    mag = np.abs(block_values.astype(np.float32))
    order = np.lexsort((np.arange(len(mag)), -mag.astype(np.float64)))
    return np.sort(order[:k])


def encode(x, block, keep):
    """x: 1-D float32 (one wire chunk, starting at a block boundary). Returns (payload bytes, decoded dense)."""
    x = np.asarray(x, dtype=np.float32)
    levels, positions, codes = [], [], []
    decoded = np.zeros_like(x)
    for start in range(0, len(x), block):
        chunk = x[start:start + block]
        pos = select(chunk, min(keep, len(chunk)))
        kept = chunk[pos]
        mag = np.abs(kept)
        lo, hi = np.float32(mag.min()), np.float32(mag.max())
        d = np.float32(hi - lo)
        r0 = np.float32(lo + np.float32(d * np.float32(0.25)))
        r1 = np.float32(hi - np.float32(d * np.float32(0.25)))
        (r0, r1), bits = bf16_round(np.array([r0, r1], dtype=np.float32))
        levels.extend([int(bits[0]), int(bits[1])])
        mid = np.float32(np.float32(r0 + r1) * np.float32(0.5))
        upper = mag > mid
        negative = kept < 0
        for p, u, neg in zip(pos, upper, negative):
            positions.append(int(p))
            codes.append((1 if neg else 0) | (2 if u else 0))
            m = r1 if u else r0
            decoded[start + p] = -m if neg else m
    payload = np.array(levels, dtype="<u2").tobytes()
    payload += pack_bits(positions, position_bits(block)).tobytes()
    payload += pack_bits(codes, 2).tobytes()
    return payload, decoded


def decode(payload, count, block, keep):
    """The receiver's side: payload -> dense float32 of count elements (no validation: the C++ test covers that)."""
    blocks = [(s, min(block, count - s)) for s in range(0, count, block)]
    kept = [min(keep, n) for _, n in blocks]
    total = sum(kept)
    pbits = position_bits(block)
    levels = np.frombuffer(payload[:4 * len(blocks)], dtype="<u2")
    pos_bytes = (total * pbits + 7) // 8
    pos_data = np.frombuffer(payload[4 * len(blocks):4 * len(blocks) + pos_bytes], dtype=np.uint8)
    code_data = np.frombuffer(payload[4 * len(blocks) + pos_bytes:], dtype=np.uint8)
    positions = unpack_bits(pos_data, total, pbits)
    codes = unpack_bits(code_data, total, 2)
    out = np.zeros(count, dtype=np.float32)
    i = 0
    for j, ((start, _), k) in enumerate(zip(blocks, kept)):
        r = (levels[2 * j:2 * j + 2].astype(np.uint32) << 16).view(np.float32)
        for _ in range(k):
            m = r[1] if codes[i] & 2 else r[0]
            out[start + positions[i]] = -m if codes[i] & 1 else m
            i += 1
    return out


def step(e, delta, beta, block, keep):
    """One round of SparseLoCo's error feedback: returns (payload, decoded sent, new e)."""
    acc = (np.float32(beta) * np.asarray(e, np.float32) + np.asarray(delta, np.float32)).astype(np.float32)
    payload, sent = encode(acc, block, keep)
    return payload, sent, (acc - sent).astype(np.float32)


def cases(rng):
    """(name, block, keep, beta, e, delta): random and adversarial inputs."""
    n = 2 * 4096 + 1000  # two full chunks and a short last one
    yield "random", 4096, 64, 0.95, rng.standard_normal(n).astype(np.float32) * 1e-3, \
        rng.standard_normal(n).astype(np.float32) * 1e-2
    ties = np.repeat(np.float32([0.5, -0.5, 0.25]), 700)[:2000]
    yield "ties", 512, 16, 0.95, np.zeros(2000, np.float32), ties
    yield "zeros", 256, 8, 0.95, np.zeros(600, np.float32), np.zeros(600, np.float32)
    yield "constant", 128, 8, 1.0, np.zeros(300, np.float32), np.full(300, -0.125, np.float32)
    sparse = np.zeros(1000, np.float32)
    sparse[[3, 77, 500, 999]] = [1.0, -2.0, 3.0, -4.0]
    yield "fewer_nonzero_than_k", 256, 8, 0.9, np.zeros(1000, np.float32), sparse
    yield "short_only", 4096, 64, 0.95, rng.standard_normal(40).astype(np.float32), \
        rng.standard_normal(40).astype(np.float32)
    wide = rng.standard_normal(3000).astype(np.float32) * np.float32(10.0) ** rng.integers(-8, 4, 3000)
    yield "wide_range", 1000, 50, 0.95, np.zeros(3000, np.float32), wide.astype(np.float32)
    yield "odd_block", 100, 7, 0.95, rng.standard_normal(333).astype(np.float32), \
        rng.standard_normal(333).astype(np.float32)


def write_golden(out):
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(30)
    names = []
    for name, block, keep, beta, e, delta in cases(rng):
        payload, sent, e_new = step(e, delta, beta, block, keep)
        assert np.array_equal(decode(payload, len(e), block, keep), sent), name
        with open(os.path.join(out, name + ".meta"), "w") as f:
            f.write(f"{block} {keep} {beta!r} {len(e)}\n")
        for suffix, arr in (("e", e), ("delta", delta), ("sent", sent), ("residual", e_new)):
            np.asarray(arr, dtype="<f4").tofile(os.path.join(out, f"{name}.{suffix}.f32"))
        with open(os.path.join(out, name + ".payload"), "wb") as f:
            f.write(payload)
        names.append(name)
    with open(os.path.join(out, "cases.txt"), "w") as f:
        f.write("\n".join(names) + "\n")
    print(f"wrote {len(names)} cases to {out}")


def rice_bits(gaps, r):
    return sum(1 + r + (g >> r) for g in gaps)


def measure_gaps(path, block, keep):
    """Bits per kept position on a real pseudo-gradient (float32 raw file): fixed P bits vs the best Rice code of
    the gaps between ascending positions (first gap from -1), one Rice parameter per push."""
    x = np.fromfile(path, dtype="<f4")
    gaps = []
    for start in range(0, len(x) - block + 1, block):
        pos = select(x[start:start + block], keep)
        gaps.extend(np.diff(np.concatenate([[-1], pos])) - 1)
    fixed = len(gaps) * position_bits(block)
    best = min((rice_bits(gaps, r), r) for r in range(0, 12))
    print(f"{len(gaps)} positions: fixed {position_bits(block)} bits: {fixed / 8:.0f} bytes; "
          f"Rice(r={best[1]}) gaps: {best[0] / 8:.0f} bytes ({best[0] / len(gaps):.2f} bits each)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--gaps")
    p.add_argument("--block", type=int, default=4096)
    p.add_argument("--keep", type=int, default=64)
    args = p.parse_args()
    if args.out:
        write_golden(args.out)
    if args.gaps:
        measure_gaps(args.gaps, args.block, args.keep)
    if not args.out and not args.gaps:
        p.error("--out or --gaps")


if __name__ == "__main__":
    sys.exit(main())
