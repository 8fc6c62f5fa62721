#!/usr/bin/env python3
"""Golden values for the llama-shaped families (llama with rope scaling and an explicit head_dim, mistral, qwen2,
qwen3) from transformers' own implementations, one tiny random model per case.

Each case is saved with save_pretrained (float32) in <out>/<case>, with its norm gains and biases (qwen2's q/k/v
biases, qwen3's q_norm/k_norm) perturbed away from their 1/0 init, and <out>/<case>_golden.safetensors holds what
tests/golden/make_hf_golden.py's golden() records (tokens [2, 16], logits, prompt [1, 8], the 32 greedy ids of
generate(do_sample=False), the greedy margin). Some cases rewrite config.json in transformers 4.x's layout
(top-level rope_theta and rope_scaling with "type") to test that reader too; transformers reads both. Others are
edited after saving (the golden is then made from the file as reloaded).
Cases (settings the other golden tests do not use):
  llama_llama3   rope llama3 (factor 8, low 1, high 4, original 64: head dims in all three bands), head_dim 24 with
                 d_model 64 / 4 heads, GQA, 5.x layout
  llama_yarn     rope yarn (factor 4, original 32, default attention factor and betas), tied head, 4.x layout
  llama_linear   rope linear (factor 2), 4.x layout with "type"
  llama_dynamic  rope dynamic (NTK, factor 4): below max_position_embeddings transformers uses the default frequencies
  llama_llama3_toplevel  rope llama3 with original_max_position_embeddings 16 at the top level of config.json (Phi-3's
                 layout) and 64 in the dict: transformers 5 takes the top-level one
  mistral        sliding_window 8 (< the 16 tokens and the 40 positions of generation), head_dim 32, GQA
  qwen2          q/k/v biases, untied head;  qwen2_tied: tied head
  qwen3          q_norm/k_norm, head_dim 32 with d_model 64 / 4 heads, GQA, rope yarn (factor 2, original 64)
The C++ side (tests/integration/hf_families_test.cc) reads each config.json with our importer.

Run by ctest (fixture hf_families) with the reference stack:  .venv/bin/python tests/golden/make_hf_families.py --out DIR
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_golden import golden, perturb_norms_and_biases  # noqa: E402

VOCAB = 256
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=128, rms_norm_eps=1e-5, initializer_range=0.1, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)


def cases():
    return {
        "llama_llama3": (LlamaForCausalLM, LlamaConfig(
            **COMMON, num_key_value_heads=2, head_dim=24, tie_word_embeddings=False,
            rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), None),
        "llama_yarn": (LlamaForCausalLM, LlamaConfig(
            **COMMON, num_key_value_heads=4, tie_word_embeddings=True,
            rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                             "original_max_position_embeddings": 32}), "rope_type"),
        "llama_linear": (LlamaForCausalLM, LlamaConfig(
            **COMMON, num_key_value_heads=1, tie_word_embeddings=False,
            rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}), "type"),
        "llama_dynamic": (LlamaForCausalLM, LlamaConfig(
            **COMMON, num_key_value_heads=2, tie_word_embeddings=False,
            rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}), None),
        "llama_llama3_toplevel": (LlamaForCausalLM, LlamaConfig(
            **COMMON, num_key_value_heads=2, tie_word_embeddings=False,
            rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), top_level_original),
        "mistral": (MistralForCausalLM, MistralConfig(
            **COMMON, num_key_value_heads=2, head_dim=32, sliding_window=8, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 20000.0}), None),
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(
            **COMMON, num_key_value_heads=2, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}), None),
        "qwen2_tied": (Qwen2ForCausalLM, Qwen2Config(
            **COMMON, num_key_value_heads=4, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), "rope_type"),
        "qwen3": (Qwen3ForCausalLM, Qwen3Config(
            **COMMON, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
            rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 2.0,
                             "original_max_position_embeddings": 64}), None),
    }


def top_level_original(directory):
    """Adds original_max_position_embeddings 16 at the top level of config.json (the dict keeps its 64)."""
    path = os.path.join(directory, "config.json")
    config = json.load(open(path))
    assert config["rope_parameters"]["original_max_position_embeddings"] == 64
    config["original_max_position_embeddings"] = 16
    json.dump(config, open(path, "w"), indent=2)


def to_4x_layout(directory, type_key):
    """Rewrites config.json as transformers 4.x wrote it: rope_theta top-level, rope_scaling (null for default)."""
    path = os.path.join(directory, "config.json")
    config = json.load(open(path))
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    rope_type = rope.pop("rope_type")
    config["rope_scaling"] = None if rope_type == "default" else {type_key: rope_type, **rope}
    config["torch_dtype"] = config.pop("dtype", "float32")
    json.dump(config, open(path, "w"), indent=2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory to write the models and golden files into")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(4321)
    gen = torch.Generator().manual_seed(4321)
    for name, (cls, config, edit) in cases().items():
        model = cls(config).float()
        perturb_norms_and_biases(model, gen)
        directory = os.path.join(args.out, name)
        model.save_pretrained(directory)
        if edit:
            edit(directory) if callable(edit) else to_4x_layout(directory, edit)
            model = cls.from_pretrained(directory, dtype=torch.float32)  # the golden of the file we hand over
        save_file(golden(model, gen), os.path.join(args.out, name + "_golden.safetensors"))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
