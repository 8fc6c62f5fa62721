#!/usr/bin/python3
"""Where the inner step's time goes, by ATen operator: torch.profiler over 30 steps of scripts/bench/train_reference.py's
model (the demo model's shape by default; the same ATen/OpenBLAS kernels the C++ worker calls), 1 thread for LibTorch
and OpenBLAS. Not a test. Prints the profiler's table sorted by self CPU time.

Usage: scripts/bench/profile_step.py TOKENS.tok [--vocab-size 512 --seq-len 64 --n-layer 2 --n-head 4 --d-model 128
       --batch-size 16]     (TOKENS.tok: a train shard, e.g. runs/bench-train/data/tok-*/train-00000.tok after scripts/bench/train)
"""
import argparse
import ctypes
import importlib.util
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokens")
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("train_reference", os.path.join(HERE, "train_reference.py"))
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    torch.set_num_threads(1)
    try:
        ctypes.CDLL("libblas.so.3").openblas_set_num_threads(1)
    except (OSError, AttributeError):
        pass
    torch.manual_seed(0)
    tokens = ref.load_tokens(a.tokens)
    model = ref.TransformerLM(a.vocab_size, a.seq_len, a.n_layer, a.n_head, a.d_model)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1)
    offsets = torch.arange(a.seq_len + 1)

    def step():
        starts = torch.randint(0, tokens.numel() - a.seq_len - 1, (a.batch_size, 1))
        w = tokens[starts + offsets]
        opt.zero_grad()
        logits = model(w[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, a.vocab_size), w[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(10):
        step()
    with torch.profiler.profile() as prof:
        for _ in range(30):
            step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
