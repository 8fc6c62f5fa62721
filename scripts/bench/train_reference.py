#!/usr/bin/python3
"""The worker's inner loop written in Python PyTorch, for scripts/bench/train: the same decoder-only transformer
(token + position embeddings, pre-LayerNorm blocks, causal attention, GELU MLP, tied head, N(0, 0.02) init), AdamW
with the same betas and weight decay, grad-norm clipping, random windows of the same token shard. Prints one JSON
line with tokens/s. Run with Debian's /usr/bin/python3 (python3-torch, the same LibTorch underneath)."""
import ctypes
import argparse
import json
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.attn_out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.mlp_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        B, T, D = x.shape
        hd = D // self.h
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.h, hd).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(hd) + mask, -1) @ v
        x = x + self.attn_out(att.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp_out(F.gelu(self.fc(self.ln2(x))))


class TransformerLM(nn.Module):
    def __init__(self, vocab, seq, layers, heads, d):
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--n-layer", type=int, required=True)
    ap.add_argument("--n-head", type=int, required=True)
    ap.add_argument("--d-model", type=int, required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    try:  # OpenBLAS sizes its own pool; the C++ worker sets it too (worker/lm/threads.h)
        ctypes.CDLL("libblas.so.3").openblas_set_num_threads(a.threads)
    except (OSError, AttributeError):
        pass
    torch.manual_seed(0)
    tokens = load_tokens(a.tokens)
    model = TransformerLM(a.vocab_size, a.seq_len, a.n_layer, a.n_head, a.d_model)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=a.weight_decay)
    offsets = torch.arange(a.seq_len + 1)
    gen = torch.Generator().manual_seed(1)

    def step():
        starts = torch.randint(0, tokens.numel() - a.seq_len - 1, (a.batch_size, 1), generator=gen)
        w = tokens[starts + offsets]
        opt.zero_grad()
        logits = model(w[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        return loss.item()

    report("python", step, model, a)


def report(impl, step, model, a, **extra):
    """Runs a.warmup untimed steps, then a.steps timed ones, and prints the JSON line scripts/bench/train* read."""
    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": impl, "tokens_per_s": a.steps * a.batch_size * a.seq_len / dt,
                      "seconds_per_step": dt / a.steps, "last_loss": loss,
                      "params": sum(p.numel() for p in model.parameters()), "threads": a.threads, **extra}))


if __name__ == "__main__":
    main()
