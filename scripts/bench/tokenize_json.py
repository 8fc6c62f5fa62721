"""The tokenizers library's side of `scripts/bench/tokenize --json KIND` (tokenizer.json throughput, issue 31).

  tokenize_json.py train KIND VOCAB TEXT OUT   trains a BPE tokenizer.json of KIND (gpt2: ByteLevel; llama3: Llama 3's
                                               Split regex + ByteLevel) with vocab VOCAB on TEXT into OUT
  tokenize_json.py time MODEL CORPUS           reads CORPUS, cuts it into pieces of whole lines of about 8 KiB and
                                               encodes them with encode_batch (add_special_tokens=False); prints the
                                               seconds of read + encode. 8 KiB, not diloco-tokenize's 1 MiB work
                                               items: the library is 2x slower on 1 MiB strings (52 s against 24 s
                                               for single lines, 5.5 MB, one thread, on a loaded machine)
Threads: RAYON_NUM_THREADS in the environment (the caller sets 1 or 2).
"""

import sys
import time

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def train(kind, vocab, text, out):
    tok = Tokenizer(models.BPE(ignore_merges=kind == "llama3"))
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=int(vocab), special_tokens=["<|bos|>", "<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([text], trainer)
    tok.save(out)


def timed_encode(model, corpus):
    tok = Tokenizer.from_file(model)
    start = time.perf_counter()
    with open(corpus, encoding="utf-8") as f:
        text = f.read()
    pieces, at, item = [], 0, 8 << 10
    while at < len(text):
        cut = text.rfind("\n", at, at + item)
        end = len(text) if at + item >= len(text) else (cut + 1 if cut >= at else at + item)
        pieces.append(text[at:end])
        at = end
    tokens = sum(len(e.ids) for e in tok.encode_batch(pieces, add_special_tokens=False))
    print(f"{time.perf_counter() - start:.3f}")
    print(f"tokens {tokens}", file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(*sys.argv[2:6])
    else:
        timed_encode(*sys.argv[2:4])
