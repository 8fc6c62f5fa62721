#!/usr/bin/env python3
"""Golden values for our llama and gpt2 architectures from Hugging Face transformers' own implementations.

Builds random-initialised tiny models with transformers (LlamaForCausalLM: grouped-query attention, an untied head,
rope_theta 500000; GPT2LMHeadModel), saves them with save_pretrained (float32; the Llama also as a bfloat16 copy),
and writes, per model, <out>/<name>_golden.safetensors with (all stored as F32; token ids are exact in float32):
  tokens [2, 16]         a batch of random token ids
  logits [2, 16, vocab]  Hugging Face's logits for it (float32)
  prompt [1, 8]          a prompt
  generated [1, 32]      the 32 new ids of model.generate(prompt, do_sample=False, max_new_tokens=32)
  margin [1]             the smallest gap between the best and second-best logit over those greedy steps (how far a
                         correct implementation is from a tie)
For llama_bf16: logits of the bf16 checkpoint loaded in float32 (from_pretrained(dtype=float32)), i.e. the model
our bf16 import must reproduce.
Norm gains and biases are perturbed away from their 1/0 init so that a loader that skipped them would fail.
Shapes are repeated by hand in tests/integration/hf_golden_test.cc.

Run by ctest (fixture hf_golden) with the reference stack:  .venv/bin/python tests/golden/make_hf_golden.py --out DIR
"""
import argparse
import os

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB = 256
PROMPT_LEN = 8
NEW_TOKENS = 32


def perturb_norms_and_biases(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or ".ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))


def greedy_margin(model, prompt, generated):
    """Smallest top-1 minus top-2 logit over the greedy steps (full forward passes over the growing sequence)."""
    seq = torch.cat([prompt, generated], dim=1)
    with torch.no_grad():
        logits = model(seq).logits[0, PROMPT_LEN - 1 : -1]  # the logits that chose each new token
    top2 = logits.topk(2, dim=-1).values
    return float((top2[:, 0] - top2[:, 1]).min())


def golden(model, gen):
    model.eval()
    tokens = torch.randint(0, VOCAB, (2, 16), generator=gen)
    prompt = torch.randint(0, VOCAB, (1, PROMPT_LEN), generator=gen)
    with torch.no_grad():
        logits = model(tokens).logits.float()
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            pad_token_id=0,
        )
    generated = out[:, PROMPT_LEN:]
    assert generated.shape == (1, NEW_TOKENS), generated.shape
    return {
        "tokens": tokens.float(),
        "logits": logits.contiguous(),
        "prompt": prompt.float(),
        "generated": generated.float().contiguous(),
        "margin": torch.tensor([greedy_margin(model, prompt, generated)]),
    }


def make_llama(out, gen):
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        initializer_range=0.1,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(config).float()
    perturb_norms_and_biases(model, gen)
    model.save_pretrained(os.path.join(out, "llama"))
    save_file(golden(model, gen), os.path.join(out, "llama_golden.safetensors"))

    bf16_dir = os.path.join(out, "llama_bf16")
    model.to(torch.bfloat16).save_pretrained(bf16_dir)
    reloaded = LlamaForCausalLM.from_pretrained(bf16_dir, dtype=torch.float32)
    save_file(golden(reloaded, gen), os.path.join(out, "llama_bf16_golden.safetensors"))


def make_gpt2(out, gen):
    config = GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_inner=128,
        n_positions=64,
        layer_norm_epsilon=1e-5,
        initializer_range=0.1,
        bos_token_id=None,
        eos_token_id=None,
    )
    model = GPT2LMHeadModel(config).float()
    perturb_norms_and_biases(model, gen)
    model.save_pretrained(os.path.join(out, "gpt2"))
    save_file(golden(model, gen), os.path.join(out, "gpt2_golden.safetensors"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory to write the models and golden files into")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(1234)
    gen = torch.Generator().manual_seed(1234)
    make_llama(args.out, gen)
    make_gpt2(args.out, gen)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
