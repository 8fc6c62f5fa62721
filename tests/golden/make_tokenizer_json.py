"""Golden tokenizer.json files and ids for tests/integration/tokenizer_json_test.cc, made by the tokenizers library.

Trains one small BPE tokenizer per kind we read (worker/tokenizer/hf_tokenizer.h) on a text with accents, CJK,
emoji, tabs, runs of spaces and long digit runs plus tinyshakespeare lines, and writes OUT/<kind>/tokenizer.json
(with a config.json naming BOS / EOS, as a model directory has) and OUT/golden.json:
  {"texts": [...], "kinds": {kind: {"ids": [[...] per text], "decoded": [...], "bos": id, "eos": id}}}
where ids are Tokenizer.encode(text, add_special_tokens=False).ids and decoded is Tokenizer.decode(ids); "document"
is a multi-line text and "document_ids" its ids in one encode() (what --format text must write however it cuts the
file into work items); "special_ids"
are Tokenizer.encode(text).ids (add_special_tokens=True: the post-processor's special tokens around them, as
transformers' tokenizer(text) gives a prompt). Post-processors as the models ship them: gpt2 ByteLevel; llama3 a
Sequence of ByteLevel and TemplateProcessing "<|bos|> $A" (Llama 3's); qwen2 none; llama2 TemplateProcessing
"<|bos|> $A <|eos|>"; metaspace RobertaProcessing (cls <|bos|>, sep <|eos|>).
Ill-formed UTF-8 ("invalid_hex": bytes with a cut 4-byte and 3-byte sequence, an encoded surrogate and an overlong
form): each kind's "invalid_ids" encode INVALID.decode("utf-8", "replace") (one U+FFFD per maximal subpart), and the
byte-level kinds' "cut_ids" (the byte tokens of those bytes) decode to "cut_decoded" (Rust's from_utf8_lossy).
Kinds: gpt2 (ByteLevel pre-tokenizer), llama3 and qwen2 (Split regex + ByteLevel; qwen2 with NFC), llama2
(byte_fallback, Prepend + Replace normalizer), metaspace (byte_fallback, Metaspace pre-tokenizer, prepend first),
lookahead (a gpt2 model with a Split regex that matches empty, before each 'e', put in front of its ByteLevel; tested
for encode / decode only: the work-item cut rule knows no such split).
Beside them, OUT/sp_llama2/tokenizer.model: Llama 2's kind of SentencePiece model (BPE, byte_fallback, the dummy
prefix, identity normalisation, no newline piece) trained by the sentencepiece library, and golden["sentencepiece"]:
its SentencePieceProcessor.encode(text) ids of each text and of the document, and decode(ids).
Also OUT/refused/<component>.json: tokenizer.json files with one component we do not implement (WordPiece,
Unigram, the Lowercase normalizer, the Whitespace pre-tokenizer, the WordPiece decoder), each to be refused by name.
Usage: make_tokenizer_json.py OUT SHAKESPEARE
"""

import json
import os
import sys

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                        trainers)

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
# A Split regex that matches only empty (before each 'e'), in front of GPT-2's ByteLevel, on a model trained without
# it (so merges across the split exist, e.g. "th" + "e"): the library splits at an empty match.
LOOKAHEAD_REGEX = r"(?=e)"
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIAL = ["<|bos|>", "<|eos|>", "<unk>"]
ADDED = "<|tool|>"  # a non-special added token
# Added tokens with the flags: single_word (not next to a Unicode letter, number or '_'), lstrip / rstrip (taking in
# Unicode whitespace on their side).
WORD = AddedToken("sword", single_word=True)
STRIP = AddedToken("<|pad|>", lstrip=True, rstrip=True)
INVALID = b"\xf0\x9f\x98A x\xe2\x82y \xed\xa0\x80z \xc0\xaf \xe6\x97\xa5"

MIXED = [
    "Café déjà vu, naïve façade — señor Müller's Ångström.",
    "東京は日本の首都です。北京欢迎你！서울 특별시",
    "Emoji: 😀🎉👍🏽 and 🇫🇷 flags, ❤️ hearts",
    "tabs\there\t\tand\t\t\tmore",
    "runs of    spaces     and       more   ",
    "digits 1234567890123456789 and 3.14159265358979 and 007",
    "line one\nline two\n\n\nafter blank lines\r\nwindows line",
    "  leading spaces and trailing  ",
    "It's I'll we've THEY'RE can't",
    "e\u0301 (e + combining acute) and \u00e9 and \u212b",
    # Line ends a work item's cut must not split: the byte-level kinds learn merges of them (GPT-2 has \n\n as one).
    "para one ends.\n\npara two ends.\n\n",
    "trailing space \nnext line \n",
    "crlf one\r\ncrlf two\r\n",
]


def document(shakespeare):
    """A text document for --format text cut into many work items: tinyshakespeare's speeches with the line starts
    and ends a cut can fall next to (blank-line runs, indented and tab-started lines, trailing spaces, CRLF, lines
    that start with CJK, U+3000 or NBSP, punctuation before newlines). Its ids are those of one encode() of it all."""
    lines = open(shakespeare, encoding="utf-8").read().split("\n")[:90]
    odd = ["    an indented line", "\ttab-started line", "trailing spaces   ", "crlf line\r", "東京は日本の首都です。",
           "\u3000ideographic space first", "\u00a0no-break space first", "Wait!!!", "", "", "three blanks above",
           " one space first", "  two spaces first", "ends with a colon:", "\u00e9t\u00e9 (NFC) e\u0301t\u0301e"]
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        if i % 6 == 5:
            out.append(odd[(i // 6) % len(odd)])
    return "\n".join(out) + "\n"


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


BYTE_CHARS = bytes_to_unicode()


def training_text(shakespeare):
    lines = open(shakespeare, encoding="utf-8").read().splitlines()[:3000]
    return MIXED * 20 + lines


def byte_level(regex, nfc):
    tok = Tokenizer(models.BPE(ignore_merges=regex is not None))
    if nfc:
        tok.normalizer = normalizers.NFC()
    if regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    return tok, trainer


def byte_fallback(metaspace):
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    # limit_alphabet leaves rare characters (CJK, emoji) out, so they take the byte fallback.
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=SPECIAL, limit_alphabet=80, show_progress=False)
    return tok, trainer


def add_byte_tokens(tok):
    """Puts <0x00>..<0xFF> into the model's vocabulary (as Llama 2's converted file has them)."""
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    for b in range(256):
        vocab.setdefault("<0x%02X>" % b, len(vocab))
    return Tokenizer.from_str(json.dumps(j))


def post_processor(kind, bos, eos):
    """The post-processor of kind (the module docstring), or None."""
    template = {"llama3": "<|bos|> $A", "llama2": "<|bos|> $A <|eos|>"}
    if kind == "gpt2":
        return processors.ByteLevel(trim_offsets=False)
    if kind in template:
        t = processors.TemplateProcessing(single=template[kind], pair=template[kind] + " $B:1",
                                          special_tokens=[("<|bos|>", bos), ("<|eos|>", eos)])
        return processors.Sequence([processors.ByteLevel(trim_offsets=False), t]) if kind == "llama3" else t
    if kind == "metaspace":
        return processors.RobertaProcessing(("<|eos|>", eos), ("<|bos|>", bos))  # sep, cls
    return None


def sentencepiece_llama2(out, text):
    """Trains Llama 2's kind of tokenizer.model on `text` into OUT/sp_llama2 and returns its processor."""
    import io

    import sentencepiece as spm
    model = io.BytesIO()
    lines = [line for t in text for line in t.split("\n") if line.strip()]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=1000,
                                   model_type="bpe", byte_fallback=True, add_dummy_prefix=True,
                                   normalization_rule_name="identity", remove_extra_whitespaces=False,
                                   split_digits=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   character_coverage=1.0, minloglevel=2)
    os.makedirs(os.path.join(out, "sp_llama2"), exist_ok=True)
    path = os.path.join(out, "sp_llama2", "tokenizer.model")
    with open(path, "wb") as f:
        f.write(model.getvalue())
    return spm.SentencePieceProcessor(model_file=path)


def write_refused(out, text):
    os.makedirs(out, exist_ok=True)
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    wordpiece.train_from_iterator(text[:200], trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]"],
                                                                        show_progress=False))
    wordpiece.save(os.path.join(out, "WordPiece.json"))
    unigram = Tokenizer(models.Unigram())
    unigram.train_from_iterator(text[:200], trainers.UnigramTrainer(vocab_size=100, show_progress=False))
    unigram.save(os.path.join(out, "Unigram.json"))
    variants = {"Lowercase": ("normalizer", normalizers.Lowercase()),
                "Whitespace": ("pre_tokenizer", pre_tokenizers.Whitespace()),
                "WordPiece-decoder": ("decoder", decoders.WordPiece())}
    for name, (attribute, component) in variants.items():
        tok, trainer = byte_level(None, False)
        tok.train_from_iterator(text[:200], trainer)
        setattr(tok, attribute, component)
        tok.save(os.path.join(out, name + ".json"))


def main():
    out, shakespeare = sys.argv[1], sys.argv[2]
    text = training_text(shakespeare)
    kinds = {
        "gpt2": byte_level(None, False),
        "llama3": byte_level(LLAMA3_REGEX, False),
        "qwen2": byte_level(QWEN2_REGEX, True),
        "llama2": byte_fallback(False),
        "metaspace": byte_fallback(True),
        "lookahead": byte_level(None, False),
    }
    texts = MIXED + [
        "First Citizen:\nBefore we proceed any further, hear me speak.",
        f"a {ADDED} b<|eos|>c<|bos|>",
        "a sword, swords, \u00absword\u00bb, \u00e9sword, sword_x, \u0663sword, \u216bsword the sword",
        "x\u3000<|pad|>\u00a0y and x <|pad|> y and x\t<|pad|>\n y",
        # single_word's neighbours as tokenizers tests them (regex \w): a mark or a joiner touches, a No digit not.
        "\u00b2sword sword\u0301 \u200dsword x\u203fsword \u0301 sword",
        # Words over 256 bytes (not cached): merged on their own, not with the words before them.
        "Hello\n\nWorld " + "=" * 300 + "\n\nend",
        "a  " + "\u6771" * 90 + " b",
        # U+180E (Mongolian vowel separator) is not \s to the library (Oniguruma: Unicode White_Space); PCRE2's \s
        # takes it: by spaces and punctuation the regexes split it differently.
        "x \u180e!y  \u180e\u180e z\u180e and\u180e \u180e",
        # Empty matches of the lookahead kind's regex: split before each 'e'.
        "the thee, there be seen here; eel",
        " ",
        "\n",
        "x",  # last: tokenizer_json_test.cc encodes "x" and reads the last ids
    ]
    golden = {"texts": texts, "document": document(shakespeare), "kinds": {}}
    for name, (tok, trainer) in kinds.items():
        tok.train_from_iterator(text, trainer)
        if name == "lookahead":
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(LOOKAHEAD_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False)])
        if tok.model.byte_fallback:
            tok = add_byte_tokens(tok)
        tok.add_tokens([ADDED, WORD, STRIP])
        bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
        if post_processor(name, bos, eos) is not None:
            tok.post_processor = post_processor(name, bos, eos)
        os.makedirs(os.path.join(out, name), exist_ok=True)
        tok.save(os.path.join(out, name, "tokenizer.json"))
        with open(os.path.join(out, name, "config.json"), "w") as f:
            json.dump({"bos_token_id": bos, "eos_token_id": eos}, f)
        ids = [tok.encode(t, add_special_tokens=False).ids for t in texts]
        golden["kinds"][name] = {"ids": ids, "decoded": [tok.decode(i) for i in ids], "bos": bos, "eos": eos,
                                 "vocab_size": tok.get_vocab_size(),
                                 "special_ids": [tok.encode(t).ids for t in texts],
                                 "document_ids": tok.encode(golden["document"], add_special_tokens=False).ids,
                                 "invalid_ids": tok.encode(INVALID.decode("utf-8", "replace"),
                                                           add_special_tokens=False).ids}
        if name in ("gpt2", "llama3", "qwen2"):  # byte-level: every byte has a token
            cut = [tok.token_to_id(BYTE_CHARS[b]) for b in INVALID]
            golden["kinds"][name].update({"cut_ids": cut, "cut_decoded": tok.decode(cut)})
    golden["invalid_hex"] = INVALID.hex()
    sp = sentencepiece_llama2(out, text)
    sp_ids = [sp.encode(t) for t in texts]
    golden["sentencepiece"] = {"ids": sp_ids, "decoded": [sp.decode(i) for i in sp_ids], "bos": sp.bos_id(),
                               "eos": sp.eos_id(), "document_ids": sp.encode(golden["document"])}
    write_refused(os.path.join(out, "refused"), text)
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
