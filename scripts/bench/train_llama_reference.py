#!/usr/bin/env python3
"""The inner loop of a llama worker in Python, for scripts/bench/train_llama: Hugging Face transformers'
LlamaForCausalLM (its default attention, SDPA) built from the same shapes, trained with torch.optim.AdamW (betas
0.9/0.95, the same weight decay, 1-D tensors exempt as inner.weight_decay_1d false), grad-norm clipping, random
windows of the same token shard, the same batch and threads. Prints one JSON line with tokens/s.
Run with the reference stack: .venv/bin/python (PyTorch 2.x and transformers from the Python package index)."""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_reference import load_tokens, report  # noqa: E402  the token shard reader and the timed loop, shared


def main():
    ap = argparse.ArgumentParser()
    for name in ("vocab-size", "seq-len", "n-layer", "n-head", "n-kv-head", "d-model", "ffn-hidden", "batch-size"):
        ap.add_argument("--" + name, type=int, required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    tokens = load_tokens(a.tokens)
    config = LlamaConfig(vocab_size=a.vocab_size, hidden_size=a.d_model, intermediate_size=a.ffn_hidden,
                         num_hidden_layers=a.n_layer, num_attention_heads=a.n_head, num_key_value_heads=a.n_kv_head,
                         max_position_embeddings=max(a.seq_len, 256), rope_theta=a.rope_theta, rms_norm_eps=1e-5,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config).train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    offsets = torch.arange(a.seq_len + 1)
    gen = torch.Generator().manual_seed(1)

    def step():
        starts = torch.randint(0, tokens.numel() - a.seq_len - 1, (a.batch_size, 1), generator=gen)
        w = tokens[starts + offsets]
        opt.zero_grad()
        logits = model(w[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        return loss.item()

    report("transformers", step, model, a, torch=torch.__version__)


if __name__ == "__main__":
    main()
