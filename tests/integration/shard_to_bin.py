#!/usr/bin/env python3
"""Rewrites the ids of one of our token shards (24-byte header "DLCOTOK", version, width, count) as the two
pre-tokenized formats users bring, with numpy as nanoGPT's prepare.py and llm.c's dev/data/data_common.py write them:

  OUT/nanogpt.bin  raw little-endian uint16 ids (np.array(ids, dtype=np.uint16).tofile)
  OUT/llmc.bin     llm.c's GPT-2 layout: 256 int32 header (magic 20240520, version 1, token count), then uint16 ids

Usage: shard_to_bin.py SHARD OUT_DIR   (tests/integration/data_test.cc trains on both)
"""
import os
import sys

import numpy as np


def main():
    shard, out = sys.argv[1], sys.argv[2]
    raw = open(shard, "rb").read()
    assert raw[:8] == b"DLCOTOK\0", "not a token shard"
    width = int(np.frombuffer(raw[12:16], dtype=np.uint32)[0])
    count = int(np.frombuffer(raw[16:24], dtype=np.uint64)[0])
    assert width == 2, "this helper writes uint16 formats"
    ids = np.frombuffer(raw[24:], dtype=np.uint16, count=count)
    os.makedirs(out, exist_ok=True)
    ids.tofile(os.path.join(out, "nanogpt.bin"))
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(ids)
    with open(os.path.join(out, "llmc.bin"), "wb") as f:
        f.write(header.tobytes())
        f.write(ids.tobytes())


if __name__ == "__main__":
    main()
