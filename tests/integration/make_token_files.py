#!/usr/bin/env python3
"""Writes pre-tokenized files for tests/integration/tokenize_test.cc (data.format tokens), with numpy as nanoGPT's
prepare.py and llm.c's dev/data/data_common.py write them:

  nanogpt.bin    raw uint16 ids 0, 1, ..., 999 (nanoGPT: np.array(ids, dtype=np.uint16).tofile(path))
  llmc.bin       llm.c GPT-2 layout: 256 int32 header (magic 20240520, version 1, count 500), uint16 ids 7 * i % 50000
  llmc3.bin      llm.c llama3 layout: header (magic 20240801, version 7, count 300), uint32 ids 100000 + i
  bad_id.bin     raw uint16, 200 ids of 5 except 60000 at position 123 (>= vocab 50257)
  truncated.bin  llm.c GPT-2 header saying 1000 ids, holding 900
  wide.bin       raw uint32 ids 3 * i % 50000 for i < 2000 (np.uint32 .tofile: data.token_dtype uint32)
  wide3.bin      raw uint32 ids (128000 + 7 * i) % 128256 for i < 2000 (Llama 3's vocabulary: high halves 0 and 1)
  long16.bin     raw uint16 ids 0, 1, ..., 3999 (real uint16 ids, enough of them for the uint32 check to look)

Usage: make_token_files.py OUT_DIR
"""
import os
import sys

import numpy as np


def write_llmc(path, magic, version, ids, claimed=None):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = magic, version, len(ids) if claimed is None else claimed
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(ids.tobytes())


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    np.arange(1000, dtype=np.uint16).tofile(os.path.join(out, "nanogpt.bin"))
    write_llmc(os.path.join(out, "llmc.bin"), 20240520, 1, (7 * np.arange(500) % 50000).astype(np.uint16))
    write_llmc(os.path.join(out, "llmc3.bin"), 20240801, 7, (100000 + np.arange(300)).astype(np.uint32))
    bad = np.full(200, 5, dtype=np.uint16)
    bad[123] = 60000
    bad.tofile(os.path.join(out, "bad_id.bin"))
    write_llmc(os.path.join(out, "truncated.bin"), 20240520, 1, np.arange(900, dtype=np.uint16), claimed=1000)
    (3 * np.arange(2000) % 50000).astype(np.uint32).tofile(os.path.join(out, "wide.bin"))
    ((128000 + 7 * np.arange(2000)) % 128256).astype(np.uint32).tofile(os.path.join(out, "wide3.bin"))
    np.arange(4000, dtype=np.uint16).tofile(os.path.join(out, "long16.bin"))


if __name__ == "__main__":
    main()
