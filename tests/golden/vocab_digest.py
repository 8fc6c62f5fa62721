"""The vocabulary digest of tokenizer files, by the libraries users trust: the reference for `diloco-tokenize digest`
(worker/tokenizer/text_tokenizer.h VocabDigest).

The digest is XXH3-64 (the xxhash package) of the pieces in id order, each as its length in 4 little-endian bytes
and then its UTF-8 bytes, printed as 16 lowercase hex digits. The pieces are sentencepiece's id_to_piece for a
SentencePiece model and tokenizers' id_to_token for a tokenizer.json (an id no token has: the empty piece), over
every id below get_piece_size() / one more than the largest id of get_vocab(with_added_tokens=True).
Usage: vocab_digest.py FILE...   prints one line per file: its digest.
"""

import struct
import sys

import xxhash


def pieces(path):
    if path.endswith(".json"):
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(path)
        size = max(tok.get_vocab(with_added_tokens=True).values()) + 1
        return [tok.id_to_token(i) or "" for i in range(size)]
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=path)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def digest(path):
    h = xxhash.xxh3_64()
    for piece in pieces(path):
        data = piece.encode("utf-8")
        h.update(struct.pack("<I", len(data)))
        h.update(data)
    return h.hexdigest()


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(digest(p))
