#!/usr/bin/env python3
"""The inner loop of a llama worker in Python, for scripts/bench/train_llama: Hugging Face transformers'
LlamaForCausalLM built from the same shapes, trained by train_reference.py's step (the worker's: torch.optim.AdamW with
betas 0.9/0.95, the same weight decay, 1-D tensors exempt with --no-decay-1d as inner.weight_decay_1d false, grad-norm
clipping, warm-up + cosine learning rate), random windows of the same token shard, the same batch and threads. Prints
one JSON line with tokens/s.
--attention picks transformers' attn_implementation: "sdpa" (its default: F.scaled_dot_product_attention) or "eager"
(its composite ops: matmul, mask, softmax, matmul); our worker calls neither (its fused kernel). --compile,
--adamw: as in train_reference.py. Run with the reference stack: .venv/bin/python (PyTorch 2.x and transformers)."""
import argparse
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_reference import add_common_args, load_tokens, make_step, report, set_threads  # noqa: E402  shared


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("vocab-size", "seq-len", "n-layer", "n-head", "n-kv-head", "d-model", "ffn-hidden"):
        ap.add_argument("--" + name, type=int, required=True)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa")
    add_common_args(ap)
    a = ap.parse_args()
    set_threads(a.threads)
    torch.manual_seed(0)
    tokens = load_tokens(a.tokens)
    config = LlamaConfig(vocab_size=a.vocab_size, hidden_size=a.d_model, intermediate_size=a.ffn_hidden,
                         num_hidden_layers=a.n_layer, num_attention_heads=a.n_head, num_key_value_heads=a.n_kv_head,
                         max_position_embeddings=max(a.seq_len, 256), rope_theta=a.rope_theta, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, attn_implementation=a.attention)
    model = LlamaForCausalLM(config).train()
    step = make_step(model, tokens, a, logits_of=lambda out: out.logits)
    report(a.label, step, model, a, attention=model.config._attn_implementation)


if __name__ == "__main__":
    main()
