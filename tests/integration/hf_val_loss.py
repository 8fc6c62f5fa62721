#!/usr/bin/env python3
"""Validation loss of a Hugging Face model directory on a run's validation shard, computed by transformers.

The batches are the coordinator's evaluation batches (worker/data/token_data.cc, TokenData::EvalBatch): batch i of n
takes, for j in 0..batch_size-1, the window of seq_len + 1 tokens starting at span * (i * batch_size + j) // (n *
batch_size), span = tokens - seq_len - 1; the loss is the mean over batches of the mean cross-entropy per token.
Usage: hf_val_loss.py HF_DIR CACHE_ROOT VOCAB_SIZE SEQ_LEN EVAL_BATCHES BATCH_SIZE   (prints the loss)
"""
import glob
import json
import os
import sys

import numpy as np
import torch
import transformers


transformers.utils.logging.disable_progress_bar()


def val_tokens(cache_root, vocab_size):
    """The validation split of the cache made from tinyshakespeare.txt alone (args.json: what diloco-tokenize was
    given), read through the token manifest (meta.json: segments of path, offset, width, count)."""
    for meta_path in sorted(glob.glob(os.path.join(cache_root, "tok-*", "meta.json"))):
        cache = os.path.dirname(meta_path)
        with open(meta_path) as f:
            meta = json.load(f)
        with open(os.path.join(cache, "args.json")) as f:
            inputs = json.load(f)["inputs"]
        if meta["vocab_size"] == vocab_size and len(inputs) == 1 and inputs[0][0].endswith("tinyshakespeare.txt"):
            parts = []
            for seg in meta["val"]:
                dtype = np.uint16 if seg["width"] == 2 else np.uint32
                path = os.path.join(cache, seg["path"])
                parts.append(np.fromfile(path, dtype=dtype, count=seg["count"], offset=seg["offset"]))
            return torch.from_numpy(np.concatenate(parts).astype(np.int64))
    raise SystemExit(f"no token cache with vocab {vocab_size} under {cache_root}")


def main():
    hf_dir, cache_root = sys.argv[1], sys.argv[2]
    vocab_size, seq_len, n, batch_size = (int(a) for a in sys.argv[3:7])
    tokens = val_tokens(cache_root, vocab_size)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    span, total, losses = len(tokens) - seq_len - 1, n * batch_size, []
    with torch.no_grad():
        for i in range(n):
            starts = [span * (i * batch_size + j) // total for j in range(batch_size)]
            windows = torch.stack([tokens[s : s + seq_len + 1] for s in starts])
            logits = model(windows[:, :-1]).logits
            losses.append(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), windows[:, 1:].reshape(-1)))
    print(f"{float(torch.stack(losses).mean()):.8f}")


if __name__ == "__main__":
    main()
