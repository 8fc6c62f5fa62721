#!/usr/bin/env python3
"""Reference of CODEC_UPDATE, the sparse pull's chunk format, written from proto/PROTOCOL.md ("CODEC_UPDATE") in
numpy only, so that it shares no code with the C++ coder (proto/update_block.h) it checks.

A chunk of `count` elements is cut into blocks of B from its first element (the last may be shorter); each block,
byte-aligned: varint u (changed positions; nothing more when 0), varint b (literal magnitudes), varint c (sums);
then one little-endian bit stream (bit 0 of a byte first, values low bit first) padded to a byte: r (4 bits, the
Rice parameter), k (2 bits: 0 fixed-width indices, 1 and 2 exp-Golomb of order k - 1, 3 canonical Huffman over
b + c + 1 symbols, the last an inline sum), b literals (the first's exponent in 8 bits and length L in 5, later
ones' changes of both zigzag exp-Golomb(0); the L high mantissa bits), c sums (1 bit: 3 terms, else 2; the terms'
literal indices in ceil(log2 b) bits; a sign bit for every term after the first: 1 subtracts; |((M0 +- M1) +- M2)|
in float32), for k = 3 the code lengths (the first in 4 bits, later ones' changes zigzag exp-Golomb(0)), u
Rice-coded position gaps, then per position its magnitude index (k = 3: its code, first bit most significant; the
last symbol is followed by a sum in the table's form) and its sign bit.

    sparse_update_reference.py --out DIR     writes cases: steps, mask and this reference's payloads (which the C++
                                             decoder must read back bit for bit: tests/unit/sparse_update_test.cc)
    sparse_update_reference.py --check DIR   decodes DIR/<case>.cpp.payload (the C++ encoder's) and compares them
                                             with DIR/<case>.steps.f32 / .mask.u8; exit 1 on any difference
"""
import argparse
import heapq
import itertools
import math
import os
import sys

import numpy as np

F32 = np.float32


def width_for(n):
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


def varint(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


class Bits:
    def __init__(self):
        self.bits = []

    def put(self, v, width):
        self.bits += [(v >> i) & 1 for i in range(width)]

    def unary(self, q):
        self.bits += [1] * q + [0]

    def bytes(self):
        b = self.bits + [0] * (-len(self.bits) % 8)
        return bytes(sum(b[i + j] << j for j in range(8)) for i in range(0, len(b), 8))


def as_bits(x):
    return int(np.array([x], dtype=F32).view(np.uint32)[0])


def as_float(u):
    return np.array([u], dtype=np.uint32).view(F32)[0]


def combine(literals, terms, minus):
    with np.errstate(over="ignore", invalid="ignore"):
        return _combine(literals, terms, minus)


def _combine(literals, terms, minus):
    v = F32(literals[terms[0]])
    for t, s in zip(terms[1:], minus):
        v = F32(v - F32(literals[t])) if s else F32(v + F32(literals[t]))
    return as_bits(v) & 0x7FFFFFFF


def zigzag(v):
    return 2 * v if v >= 0 else -2 * v - 1


def unzigzag(z):
    return -((z + 1) // 2) if z & 1 else z // 2


def exp_golomb(bits, n, k):
    v = n + (1 << k)
    q = v.bit_length() - 1 - k
    bits.unary(q)
    bits.put(v - (1 << (q + k)), q + k)


def read_exp_golomb(rd, k):
    q = rd.unary()
    assert q <= 16
    return rd.get(q + k) + (1 << (q + k)) - (1 << k)


def huffman_lengths(counts):
    """Code lengths of a Huffman code for counts (0 for a count of 0), built with heapq."""
    heap = [(n, i, [i]) for i, n in enumerate(counts) if n > 0]
    heapq.heapify(heap)
    lengths = [0] * len(counts)
    serial = len(counts)
    while len(heap) > 1:
        n1, _, s1 = heapq.heappop(heap)
        n2, _, s2 = heapq.heappop(heap)
        for i in s1 + s2:
            lengths[i] += 1
        heapq.heappush(heap, (n1 + n2, serial, s1 + s2))
        serial += 1
    assert sum(1 for n in counts if n > 0) >= 2 and max(lengths) <= 15
    return lengths


def canonical(lengths):
    """{symbol: (length, code)}: shorter codes first, ties in symbol order, each the previous code + 1 (shifted)."""
    order = sorted((n, i) for i, n in enumerate(lengths) if n > 0)
    codes, code, prev = {}, 0, order[0][0]
    for k, (n, i) in enumerate(order):
        if k > 0:
            code = (code + 1) << (n - prev)
        else:
            code = 0
        codes[i], prev = (n, code), n
    return codes


def encode_block(positions, steps, code):
    """positions: ascending ints; steps: uint32 bit patterns. This reference's choices: magnitudes in order of first
    appearance; one is a sum when some pair or triple of the first 8 literals gives it exactly."""
    u = len(positions)
    out = bytearray(varint(u))
    if u == 0:
        return bytes(out)
    literals, sums, order = [], [], []
    for s in steps:
        m = s & 0x7FFFFFFF
        if m in order:
            continue
        order.append(m)
        found = None
        lit = [as_float(x) for x in literals[:8]]
        for n in (2, 3):
            for terms in itertools.product(range(len(lit)), repeat=n):
                for minus in itertools.product((0, 1), repeat=n - 1):
                    if found is None and combine(lit, terms, minus) == m:
                        found = (terms, minus)
            if found:
                break
        if found:
            sums.append((m, found))
        else:
            literals.append(m)
    inline = {}
    if code == 3:  # sums used by one position go inline
        uses = {m: sum(1 for s in steps if s & 0x7FFFFFFF == m) for m, _ in sums}
        inline = {m: f for m, f in sums if uses[m] == 1}
        sums = [(m, f) for m, f in sums if uses[m] > 1]
    table = literals + [m for m, _ in sums]
    out += varint(len(literals)) + varint(len(sums))
    gaps = [positions[0]] + [positions[i] - positions[i - 1] - 1 for i in range(1, u)]
    r = min(range(16), key=lambda r: sum((g >> r) + 1 + r for g in gaps))
    bits = Bits()
    bits.put(r, 4)
    bits.put(code, 2)
    before = None
    for m in literals:
        mantissa = m & 0x7FFFFF
        length = 0 if mantissa == 0 else 23 - ((mantissa & -mantissa).bit_length() - 1)
        if before is None:
            bits.put(m >> 23, 8)
            bits.put(length, 5)
        else:
            exp_golomb(bits, zigzag((m >> 23) - before[0]), 0)
            exp_golomb(bits, zigzag(length - before[1]), 0)
        bits.put(mantissa >> (23 - length), length)
        before = (m >> 23, length)
    w = width_for(len(literals))

    def put_sum(terms, minus):
        bits.put(1 if len(terms) == 3 else 0, 1)
        for t in terms:
            bits.put(t, w)
        for s in minus:
            bits.put(s, 1)

    for _, f in sums:
        put_sum(*f)
    symbols = [table.index(s & 0x7FFFFFFF) if s & 0x7FFFFFFF not in inline else len(table) for s in steps]
    if code == 3:
        lengths = huffman_lengths([symbols.count(i) for i in range(len(table) + 1)])
        bits.put(lengths[0], 4)
        for a, b in zip(lengths, lengths[1:]):
            exp_golomb(bits, zigzag(b - a), 0)
        codes = canonical(lengths)
    for g in gaps:
        bits.unary(g >> r)
        bits.put(g, r)
    for s, i in zip(steps, symbols):
        if code == 0:
            bits.put(i, width_for(len(table)))
        elif code == 3:
            n, c = codes[i]
            for k in reversed(range(n)):
                bits.put((c >> k) & 1, 1)
            if i == len(table):
                put_sum(*inline[s & 0x7FFFFFFF])
        else:
            exp_golomb(bits, i, code - 1)
        bits.put(s >> 31, 1)
    return bytes(out) + bits.bytes()


class Reader:
    def __init__(self, data):
        self.data, self.at, self.acc, self.fill = data, 0, 0, 0

    def varint(self):
        v, shift = 0, 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            v |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return v

    def bit(self):
        if self.fill == 0:
            self.acc, self.fill = self.data[self.at], 8
            self.at += 1
        b = self.acc & 1
        self.acc >>= 1
        self.fill -= 1
        return b

    def get(self, width):
        return sum(self.bit() << i for i in range(width))

    def unary(self):
        q = 0
        while self.bit():
            q += 1
        return q


def decode_block(rd, length):
    u = rd.varint()
    assert u <= length
    if u == 0:
        return [], []
    b, c = rd.varint(), rd.varint()
    assert 1 <= b and b + c <= u
    r, code = rd.get(4), rd.get(2)
    table = []
    e = n = None
    for _ in range(b):
        if e is None:
            e, n = rd.get(8), rd.get(5)
        else:
            e += unzigzag(read_exp_golomb(rd, 0))
            n += unzigzag(read_exp_golomb(rd, 0))
        assert 0 <= e < 255 and 0 <= n <= 23
        table.append((e << 23) | (rd.get(n) << (23 - n)))
    lit = [as_float(x) for x in table[:b]]
    w = width_for(b)

    def read_sum():
        n = 3 if rd.get(1) else 2
        terms = [rd.get(w) for _ in range(n)]
        minus = [rd.get(1) for _ in range(n - 1)]
        assert max(terms) < b
        m = combine(lit, terms, minus)
        assert np.isfinite(as_float(m))
        return m

    for _ in range(c):
        table.append(read_sum())
    if code == 3:
        lengths = [rd.get(4)]
        for _ in range(b + c):
            lengths.append(lengths[-1] + unzigzag(read_exp_golomb(rd, 0)))
        assert all(0 <= n <= 15 for n in lengths)
        assert sum(2 ** (15 - n) for n in lengths if n > 0) == 2 ** 15
        decode = {v: i for i, v in canonical(lengths).items()}
    positions, pos = [], -1
    for _ in range(u):
        q = rd.unary()
        pos += ((q << r) | rd.get(r)) + 1
        assert pos < length
        positions.append(pos)
    steps = []
    for _ in range(u):
        if code == 0:
            i = rd.get(width_for(len(table)))
        elif code == 3:
            n, v = 0, 0
            while (n, v) not in decode:
                v, n = (v << 1) | rd.get(1), n + 1
                assert n <= 15
            i = decode[(n, v)]
        else:
            i = read_exp_golomb(rd, code - 1)
        if code == 3 and i == len(table):
            m = read_sum()
        else:
            assert i < len(table)
            m = table[i]
        steps.append(m | (rd.get(1) << 31))
    rd.fill = 0
    return positions, steps


def encode_chunk(mask, steps, block, code):
    bits = steps.view(np.uint32)
    out = b""
    for start in range(0, len(mask), block):
        pos = np.nonzero(mask[start:start + block])[0]
        out += encode_block([int(p) for p in pos], [int(bits[start + p]) for p in pos], code)
    return out


def decode_chunk(payload, count, block):
    rd = Reader(payload)
    mask, steps = np.zeros(count, np.uint8), np.zeros(count, np.uint32)
    for start in range(0, count, block):
        positions, values = decode_block(rd, min(block, count - start))
        for p, s in zip(positions, values):
            mask[start + p], steps[start + p] = 1, s
    assert rd.at == len(payload), "bytes after the last block"
    return mask, steps.view(F32)


def bf16(x):
    u = np.asarray(x, F32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(F32)


def workers_case(rng, count, block, workers, weight):
    """W workers each keep 64 positions of every block with one of 4 bf16 levels; the coordinator's float32 sum."""
    acc = np.zeros(count, F32)
    for _ in range(workers):
        for start in range(0, count, block):
            n = min(block, count - start)
            levels = bf16(rng.uniform(1e-3, 4e-2, 2))
            pos = rng.choice(n, min(64, n), replace=False)
            vals = levels[rng.integers(0, 2, len(pos))] * rng.choice([F32(-1), F32(1)], len(pos))
            for p, v in zip(pos, vals):
                acc[start + p] = F32(acc[start + p] + F32(F32(weight) * F32(v)))
    mask = (acc.view(np.uint32) != 0).astype(np.uint8)
    return mask, F32(-1) * acc


def cases():
    rng = np.random.default_rng(30)
    out = {}
    out["one_worker"] = (4096, 3 * 4096 + 1000, 0) + workers_case(rng, 3 * 4096 + 1000, 4096, 1, 1.0)
    out["four_workers"] = (4096, 2 * 4096, 1) + workers_case(rng, 2 * 4096, 4096, 4, 0.25)
    out["four_workers_huffman"] = (4096, 2 * 4096, 3) + workers_case(rng, 2 * 4096, 4096, 4, 0.25)
    out["three_workers"] = (512, 3000, 2) + workers_case(rng, 3000, 512, 3, 1.0 / 3)
    dense = rng.standard_normal(300).astype(F32)
    out["dense_distinct"] = (64, 300, 2, np.ones(300, np.uint8), dense)
    out["dense_distinct_huffman"] = (64, 300, 3, np.ones(300, np.uint8), dense)
    ext = np.array([np.finfo(F32).max, -np.finfo(F32).max, 1e-45, -1e-45, 1.1754942e-38, -0.0, 1.0, -1.0,
                    0.5, 1.5, 3e38, -2.0, 6.0, 0.25, -0.0, 7.0], F32)
    out["extremes"] = (16, 16, 0, np.ones(16, np.uint8), ext)
    m = np.zeros(40, np.uint8)
    m[[0, 1, 33, 39]] = 1
    s = np.zeros(40, F32)
    s[[0, 1, 33, 39]] = [2.0, -2.0, 4.0, 6.0]
    out["sparse_blocks"] = (8, 40, 1, m, s)
    m2 = (rng.random(11) < 0.5).astype(np.uint8)
    m2[10] = 1
    s2 = np.where(m2 == 1, F32(-0.75), F32(0)).astype(F32)
    out["block_of_two"] = (2, 11, 0, m2, s2)
    return out


def write(dirname):
    os.makedirs(dirname, exist_ok=True)
    names = []
    for name, (block, count, code, mask, steps) in cases().items():
        steps = np.where(mask == 1, steps, F32(0)).astype(F32)
        payload = encode_chunk(mask, steps, block, code)
        m2, s2 = decode_chunk(payload, count, block)  # the reference reads its own payload back
        assert (m2 == mask).all() and (s2.view(np.uint32) == steps.view(np.uint32)).all(), name
        base = os.path.join(dirname, "update_" + name)
        with open(base + ".meta", "w") as f:
            f.write(f"{block} {count}\n")
        steps.tofile(base + ".steps.f32")
        mask.tofile(base + ".mask.u8")
        with open(base + ".payload", "wb") as f:
            f.write(payload)
        names.append("update_" + name)
    with open(os.path.join(dirname, "update_cases.txt"), "w") as f:
        f.write("\n".join(names) + "\n")


def check(dirname):
    bad = 0
    for name in open(os.path.join(dirname, "update_cases.txt")).read().split():
        base = os.path.join(dirname, name)
        block, count = map(int, open(base + ".meta").read().split())
        mask = np.fromfile(base + ".mask.u8", np.uint8)
        steps = np.fromfile(base + ".steps.f32", F32)
        payload = open(base + ".cpp.payload", "rb").read()
        try:
            m2, s2 = decode_chunk(payload, count, block)
            same = (m2 == mask).all() and (s2.view(np.uint32)[mask == 1] == steps.view(np.uint32)[mask == 1]).all()
        except (AssertionError, IndexError) as e:
            same = False
            print(f"{name}: {e!r}")
        if not same:
            print(f"{name}: the C++ payload decodes to other steps")
            bad += 1
    print("ok" if bad == 0 else f"{bad} cases differ")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--check")
    a = ap.parse_args()
    if a.out:
        write(a.out)
    if a.check:
        return check(a.check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
