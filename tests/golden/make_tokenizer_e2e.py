"""Model directories whose tokenizer is a tokenizer.json, for tests/integration/hf_tokenizer_e2e_test.cc.

make OUT SHAKESPEARE: trains Llama 3's kind (Split regex + ByteLevel) and Qwen2's kind (Split regex + ByteLevel, NFC)
of tokenizer.json with the tokenizers library (make_tokenizer_json.py's settings), and saves beside each a tiny
random model of the family (transformers' LlamaForCausalLM / Qwen2ForCausalLM, vocab_size = the tokenizer's, BOS / EOS
its special tokens) with save_pretrained: OUT/llama (post-processor: Llama 3's Sequence of ByteLevel and the template
"<|bos|> $A"), OUT/qwen2 (Qwen2.5's ByteLevel: no BOS) and OUT/qwen2_bos (a Qwen2 model whose tokenizer's template
adds BOS, as DeepSeek-R1-Distill-Qwen's does). OUT/golden.json holds per family the prompt, its ids as
AutoTokenizer.from_pretrained(DIR)(prompt) gives them (the post-processor's special tokens included: what a
transformers user's generate starts from), the same without special tokens ("plain_ids"), and
model.generate(ids, do_sample=False, max_new_tokens=32) past the prompt. OUT/llama also has a tokenizer_config.json
naming BOS and EOS.
check DIR PROMPT IDS PLAIN [BOS]: loads DIR (an export) with AutoTokenizer and prints "check_tokenizer: OK <class>"
when tokenizer(PROMPT) gives IDS and encode(PROMPT, add_special_tokens=False) PLAIN (space-separated), decode gives
PROMPT back and (if BOS is given: llama) its bos_token is BOS and its chat template (OUT/llama/chat_template.jinja,
where transformers 5 saves one) renders a message.
"""

import json
import os
import sys

import torch
from tokenizers import processors

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_json import LLAMA3_REGEX, QWEN2_REGEX, byte_level, training_text  # noqa: E402  shared settings

PROMPT = "First Citizen:\nCafé 東京 😀 1234567 — speak, speak."
CHAT_TEMPLATE = "{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
CHAT = [{"role": "user", "content": "speak"}]


def bos_template(bos, wrap):
    """A post-processor adding BOS before the text: TemplateProcessing, inside a Sequence after ByteLevel if wrap."""
    t = processors.TemplateProcessing(single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B:1",
                                      special_tokens=[("<|bos|>", bos)])
    return processors.Sequence([processors.ByteLevel(trim_offsets=False), t]) if wrap else t


def make(out, shakespeare):
    from transformers import (AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)
    text = training_text(shakespeare)
    # name: regex, NFC, config, model, post-processor ("seq": Llama 3's, "bos": the template alone, None: ByteLevel)
    families = {"llama": (LLAMA3_REGEX, False, LlamaConfig, LlamaForCausalLM, "seq"),
                "qwen2": (QWEN2_REGEX, True, Qwen2Config, Qwen2ForCausalLM, None),
                "qwen2_bos": (QWEN2_REGEX, True, Qwen2Config, Qwen2ForCausalLM, "bos")}
    golden = {}
    for name, (regex, nfc, config_class, model_class, post) in families.items():
        tok, trainer = byte_level(regex, nfc)
        tok.train_from_iterator(text, trainer)
        bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
        tok.post_processor = (bos_template(bos, post == "seq") if post else
                              processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False))
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
        if name == "llama":  # llama's directory also names its special tokens, as real ones do (the export carries it),
            # and has a chat template where transformers 5 saves one (chat_template.jinja)
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>"}, f)
            with open(os.path.join(d, "chat_template.jinja"), "w") as f:
                f.write(CHAT_TEMPLATE)
        ids = AutoTokenizer.from_pretrained(d)(PROMPT)["input_ids"]
        if ids != ([bos] if post else []) + tok.encode(PROMPT, add_special_tokens=False).ids:
            sys.exit(f"make_tokenizer_e2e: {name}: AutoTokenizer's prompt ids {ids[:4]}... are not the template's")
        with torch.no_grad():
            generated = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=32, min_new_tokens=32,
                                       eos_token_id=None, pad_token_id=eos)[0, len(ids):].tolist()
        golden[name] = {"prompt": PROMPT, "prompt_ids": ids, "plain_ids": tok.encode(PROMPT, add_special_tokens=False).ids,
                        "generated": generated, "decoded": tok.decode(generated), "bos": bos, "eos": eos}
        with open(os.path.join(out, name + "_prompt.txt"), "w", encoding="utf-8") as f:  # for the shell of check
            f.write(PROMPT)
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)


def check(directory, prompt, ids, plain, bos=None):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(directory)
    if bos is not None and tok.bos_token != bos:
        sys.exit(f"check_tokenizer: AutoTokenizer's bos_token is {tok.bos_token!r}, expected {bos!r}")
    if bos is not None and tok.apply_chat_template(CHAT, tokenize=False) != "<|bos|>user: speak\n":
        sys.exit("check_tokenizer: the chat template (chat_template.jinja) did not come along")
    with_special = tok(prompt)["input_ids"]
    if with_special != [int(i) for i in ids.split()]:
        sys.exit(f"check_tokenizer: AutoTokenizer's tokenizer(prompt) is {with_special}, expected {ids}")
    got = tok.encode(prompt, add_special_tokens=False)
    want = [int(i) for i in plain.split()]
    if got != want:
        sys.exit(f"check_tokenizer: AutoTokenizer encodes {got}, expected {want}")
    if tok.decode(got) != prompt:
        sys.exit(f"check_tokenizer: AutoTokenizer decodes {tok.decode(got)!r}, expected {prompt!r}")
    print(f"check_tokenizer: OK {type(tok).__name__}")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], *sys.argv[6:7])
    else:
        sys.exit(__doc__)
