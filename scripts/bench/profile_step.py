#!/usr/bin/python3
"""Where the inner step's time goes, by ATen operator: torch.profiler over 30 steps of scripts/bench/train_reference.py's
step (its model and the worker's AdamW, clipping and schedule; the demo model's shape by default), after 10 untimed
steps, 1 thread for LibTorch and its BLAS unless --threads says otherwise. Not a test. Prints the profiler's table sorted
by self CPU time. Runs under Debian's /usr/bin/python3 (PyTorch 1.13, the LibTorch and OpenBLAS of the worker's Debian
build) and .venv/bin/python (PyTorch 2.x, MKL); every train_reference.py option is accepted (e.g. --attention sdpa,
--compile: then the warm-up holds the compilation and the table shows the compiled graph's kernels).

Usage: scripts/bench/profile_step.py TOKENS.tok [--profile-steps 30] [train_reference.py options, e.g. --vocab-size 512
       --seq-len 64 --n-layer 2 --n-head 4 --d-model 128 --batch-size 16 --threads 1 --attention sdpa --compile]
       (TOKENS.tok: a train shard, e.g. runs/bench-train/data/tok-*/train-00000.tok after scripts/bench/train)
"""
import argparse
import importlib.util
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DEMO = ["--vocab-size", "512", "--seq-len", "64", "--n-layer", "2", "--n-head", "4", "--d-model", "128",
        "--batch-size", "16", "--warmup", "10"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokens")
    ap.add_argument("--profile-steps", type=int, default=30)
    ap.add_argument("--row-limit", type=int, default=20)
    own, rest = ap.parse_known_args()
    spec = importlib.util.spec_from_file_location("train_reference", os.path.join(HERE, "train_reference.py"))
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    a = ref.parser().parse_args(["--tokens", own.tokens] + DEMO + rest)  # a later flag overrides the demo's
    ref.set_threads(a.threads)
    torch.manual_seed(0)
    model = ref.TransformerLM(a.vocab_size, a.seq_len, a.n_layer, a.n_head, a.d_model, a.attention).train()
    step = ref.make_step(model, ref.load_tokens(a.tokens), a)
    for i in range(a.warmup):
        step(i)
    with torch.profiler.profile() as prof:
        for i in range(a.warmup, a.warmup + own.profile_steps):
            step(i)
    print(f"torch {torch.__version__}, BLAS {ref.blas_info()}, {a.threads} thread(s), attention {a.attention}, "
          f"compile {a.compile}, adamw {a.adamw}; {own.profile_steps} steps profiled")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=own.row_limit))


if __name__ == "__main__":
    main()
