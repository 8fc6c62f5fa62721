#!/usr/bin/python3
"""The worker's inner loop written in Python PyTorch, for scripts/bench/train: the same decoder-only transformer as
model.arch gpt (worker/lm/arch_gpt.cc: token + position embeddings, pre-LayerNorm blocks with eps 1e-5, causal
multi-head attention from one fused q/k/v projection, exact-erf GELU MLP of 4 x d_model, final LayerNorm, head tied to
the token embedding; N(0, 0.02) init), the worker's inner step (inner: AdamW with betas 0.9/0.95, eps 1e-8, decoupled
weight decay on every tensor unless --no-decay-1d, global grad-norm clipping, linear warm-up then cosine learning
rate), random windows of the same token shard, the same batch and threads. Prints one JSON line with tokens/s.

Runs under Debian's /usr/bin/python3 (python3-torch 1.13: the same LibTorch as the Debian build of the worker) and
under PyTorch 2.x (.venv/bin/python). Options that need 2.x refuse to run on 1.13 with one line saying so:
  --attention sdpa   F.scaled_dot_product_attention(is_causal=True) instead of the composite ops (matmul, additive
                     -inf mask, softmax, matmul: what the worker's --composite-ops runs). Neither build of the worker
                     calls SDPA: on CPU float32 it runs its own fused kernel (worker/lm/causal_attention.h).
  --compile          torch.compile(model) with the inductor backend in its default mode (mode="default"; no CUDA
                     graphs, no max-autotune); the optimizer step stays eager. Compilation happens in the first step:
                     that step is timed on its own (first_step_s) and, like every warm-up step, excluded from tokens/s.
  --adamw fused      torch.optim.AdamW(fused=True) (2.4+ on CPU) instead of the default for-loop implementation.
"""
import argparse
import ctypes
import json
import math
import re
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH_MAJOR = int(torch.__version__.split(".")[0])


class Block(nn.Module):
    def __init__(self, d, h, attention="composite"):
        super().__init__()
        self.h, self.attention = h, attention
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.attn_out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.mlp_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        B, T, D = x.shape
        hd = D // self.h
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.h, hd).permute(2, 0, 3, 1, 4)  # each [B, h, T, hd]
        if self.attention == "sdpa":
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # as CausalSelfAttentionReference in worker/lm/causal_attention.cc
            att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(hd) + mask, -1) @ v
        x = x + self.attn_out(att.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp_out(F.gelu(self.fc(self.ln2(x))))


class TransformerLM(nn.Module):
    def __init__(self, vocab, seq, layers, heads, d, attention="composite"):
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, attention) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for name, p in self.named_parameters():
            if "ln" in name:
                continue
            nn.init.zeros_(p) if name.endswith("bias") else nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T))
        mask = torch.full((T, T), float("-inf")).triu(1)
        for b in self.blocks:
            x = b(x, mask)
        return self.ln_f(x) @ self.tok_emb.weight.t()


def load_tokens(path):
    header = np.fromfile(path, dtype=np.uint32, count=6)
    dtype = np.uint16 if header[3] == 2 else np.uint32
    return torch.from_numpy(np.fromfile(path, dtype=dtype, offset=24).astype(np.int64))


def inner_lr(a, step, total_steps):
    """worker/lr_schedule.cc's InnerLearningRate: linear warm-up, then cosine down to lr * min_lr_ratio."""
    if a.lr_warmup > 0 and step < a.lr_warmup:
        return a.lr * (step + 1) / a.lr_warmup
    span = max(1.0, total_steps - 1 - a.lr_warmup)
    progress = min(1.0, max(0.0, (step - a.lr_warmup) / span))
    return a.lr * (a.min_lr_ratio + (1.0 - a.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def blas_info():
    m = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return m.group(1) if m else "?"


def set_threads(n):
    """LibTorch's intra-op threads, and OpenBLAS's own pool where LibTorch calls the system BLAS (Debian's build; the
    C++ worker does the same in proto/compute_threads.h). The PyPI wheel's MKL follows torch.set_num_threads."""
    torch.set_num_threads(n)
    if blas_info() != "mkl":
        try:
            ctypes.CDLL("libblas.so.3").openblas_set_num_threads(n)
        except (OSError, AttributeError):
            pass


def need_2x(flag):
    if TORCH_MAJOR < 2:
        raise SystemExit(f"error: {flag} needs PyTorch 2.x; this is {torch.__version__} (run it with .venv/bin/python)")


def add_common_args(ap):
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--lr-warmup", type=int, default=50, help="inner.warmup_steps")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1, help="inner.min_lr_ratio")
    ap.add_argument("--schedule-steps", type=int, default=0,
                    help="steps the cosine spans (outer.rounds x H in the worker); 0: warm-up + timed steps")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--no-decay-1d", action="store_true", help="inner.weight_decay_1d false: 1-D tensors not decayed")
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--adamw", choices=("default", "fused"), default="default")
    ap.add_argument("--compile", action="store_true", help="torch.compile(model), inductor, mode default (2.x)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps before the timed ones (at least 1)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--label", default="python", help="the impl field of the JSON line")


def make_step(model, tokens, a, logits_of=lambda out: out):
    """The worker's inner step (worker/trainer.cc TrainSteps) on `model`: returns step(i) -> loss."""
    if a.compile:
        need_2x("--compile")
        model = torch.compile(model, backend="inductor", mode="default")
    params = list(model.parameters())
    decay = [p for p in params if p.dim() >= 2 or not a.no_decay_1d]
    no_decay = [p for p in params if p.dim() < 2 and a.no_decay_1d]
    groups = [{"params": decay, "weight_decay": a.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    kwargs = {}
    if a.adamw == "fused":
        need_2x("--adamw fused")
        kwargs["fused"] = True
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **kwargs)
    offsets = torch.arange(a.seq_len + 1)
    gen = torch.Generator().manual_seed(1)
    total = a.schedule_steps or (a.warmup + a.steps)

    def step(i):
        lr = inner_lr(a, i, total)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, tokens.numel() - a.seq_len - 1, (a.batch_size, 1), generator=gen)
        w = tokens[starts + offsets]
        opt.zero_grad()
        logits = logits_of(model(w[:, :-1]))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        loss.backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        opt.step()
        return loss.item()

    return step


def parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("vocab-size", "seq-len", "n-layer", "n-head", "d-model"):
        ap.add_argument("--" + name, type=int, required=True)
    ap.add_argument("--attention", choices=("composite", "sdpa"), default="composite")
    add_common_args(ap)
    return ap


def main():
    a = parser().parse_args()
    if a.attention == "sdpa":
        need_2x("--attention sdpa")
    set_threads(a.threads)
    torch.manual_seed(0)
    tokens = load_tokens(a.tokens)
    model = TransformerLM(a.vocab_size, a.seq_len, a.n_layer, a.n_head, a.d_model, a.attention).train()
    report(a.label, make_step(model, tokens, a), model, a, attention=a.attention)


def matmul_gflops():
    """A 1024^3 fp32 matrix product's rate, median of 10 (as diloco-bench-train's matmul peak)."""
    x, y = torch.randn(1024, 1024), torch.randn(1024, 1024)
    x @ y
    t = []
    for _ in range(10):
        t0 = time.perf_counter()
        x @ y
        t.append(time.perf_counter() - t0)
    return 2 * 1024 ** 3 / sorted(t)[5] / 1e9


def report(impl, step, model, a, **extra):
    """Runs a.warmup untimed steps (the first timed on its own: with --compile it holds the compilation), then
    a.steps timed ones, and prints the JSON line scripts/bench/train* read."""
    t0 = time.perf_counter()
    step(0)
    first_step_s = time.perf_counter() - t0
    for i in range(1, a.warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(a.warmup, a.warmup + a.steps):
        loss = step(i)
    dt = time.perf_counter() - t0
    if a.compile:
        from torch._dynamo.utils import counters
        extra["graphs"] = counters["stats"]["unique_graphs"]
        extra["graph_breaks"] = sum(counters["graph_break"].values())
    print(json.dumps({"impl": impl, "tokens_per_s": a.steps * a.batch_size * a.seq_len / dt,
                      "seconds_per_step": dt / a.steps, "first_step_s": first_step_s, "last_loss": loss,
                      "params": sum(p.numel() for p in model.parameters()), "threads": a.threads,
                      "torch": torch.__version__, "blas": blas_info(), "compile": a.compile, "adamw": a.adamw,
                      "matmul_gflops": matmul_gflops(), **extra}))


if __name__ == "__main__":
    main()
