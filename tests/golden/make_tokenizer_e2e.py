"""Model directories whose tokenizer is a tokenizer.json, for tests/integration/hf_tokenizer_e2e_test.cc.

make OUT SHAKESPEARE: trains Llama 3's kind (Split regex + ByteLevel) and Qwen2's kind (Split regex + ByteLevel, NFC)
of tokenizer.json with the tokenizers library (make_tokenizer_json.py's settings), and saves beside each a tiny
random model of the family (transformers' LlamaForCausalLM / Qwen2ForCausalLM, vocab_size = the tokenizer's, BOS / EOS
its special tokens) with save_pretrained: OUT/llama and OUT/qwen2. OUT/golden.json holds per family the prompt, its ids
(Tokenizer.encode(prompt, add_special_tokens=False).ids, after BOS for llama, as transformers' Llama tokenizers add
it; Qwen2 adds none) and model.generate(ids, do_sample=False, max_new_tokens=32) past the prompt.
OUT/llama also has a tokenizer_config.json naming BOS and EOS.
check DIR PROMPT IDS [BOS]: loads DIR (an export) with AutoTokenizer and prints "check_tokenizer: OK <class>" when
encode(PROMPT, add_special_tokens=False) gives IDS (space-separated), decode gives PROMPT back and (if given) its
bos_token is BOS.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_json import LLAMA3_REGEX, QWEN2_REGEX, byte_level, training_text  # noqa: E402  shared settings

PROMPT = "First Citizen:\nCafé 東京 😀 1234567 — speak, speak."


def make(out, shakespeare):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    text = training_text(shakespeare)
    families = {"llama": (LLAMA3_REGEX, False, LlamaConfig, LlamaForCausalLM, True),
                "qwen2": (QWEN2_REGEX, True, Qwen2Config, Qwen2ForCausalLM, False)}
    golden = {}
    for name, (regex, nfc, config_class, model_class, bos_first) in families.items():
        tok, trainer = byte_level(regex, nfc)
        tok.train_from_iterator(text, trainer)
        bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
        torch.manual_seed(3)
        config = config_class(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=96,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              max_position_embeddings=256, bos_token_id=bos, eos_token_id=eos,
                              tie_word_embeddings=False)
        model = model_class(config).eval()
        with torch.no_grad():  # larger weights than the init's 0.02: a peaked, non-repeating greedy path
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.15)
        d = os.path.join(out, name)
        model.save_pretrained(d)
        tok.save(os.path.join(d, "tokenizer.json"))
        if bos_first:  # llama's directory also names its special tokens, as real ones do (the export carries it)
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>"}, f)
        ids = ([bos] if bos_first else []) + tok.encode(PROMPT, add_special_tokens=False).ids
        with torch.no_grad():
            generated = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=32, min_new_tokens=32,
                                       eos_token_id=None, pad_token_id=eos)[0, len(ids):].tolist()
        golden[name] = {"prompt": PROMPT, "prompt_ids": ids, "generated": generated, "decoded": tok.decode(generated),
                        "bos": bos, "eos": eos}
        with open(os.path.join(out, name + "_prompt.txt"), "w", encoding="utf-8") as f:  # for the shell of check
            f.write(PROMPT)
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)


def check(directory, prompt, ids, bos=None):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(directory)
    if bos is not None and tok.bos_token != bos:
        sys.exit(f"check_tokenizer: AutoTokenizer's bos_token is {tok.bos_token!r}, expected {bos!r}")
    got = tok.encode(prompt, add_special_tokens=False)
    want = [int(i) for i in ids.split()]
    if got != want:
        sys.exit(f"check_tokenizer: AutoTokenizer encodes {got}, expected {want}")
    if tok.decode(got) != prompt:
        sys.exit(f"check_tokenizer: AutoTokenizer decodes {tok.decode(got)!r}, expected {prompt!r}")
    print(f"check_tokenizer: OK {type(tok).__name__}")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4], *sys.argv[5:6])
    else:
        sys.exit(__doc__)
