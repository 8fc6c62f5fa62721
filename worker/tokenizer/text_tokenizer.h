// TextTokenizer: the tokenizer diloco-tokenize encodes with, whichever file the user gives: a SentencePiece model
// (tokenizer.model: lines are encoded one by one, each '\n' becoming the newline id, "<nl>" or "<0x0A>", since
// SentencePiece drops it) or a Hugging Face tokenizer.json (hf_tokenizer.h: the whole text, newlines included, as the
// tokenizers library encodes it). LoadTextTokenizer picks the kind by the file's extension (.json: tokenizer.json).
// Encode and Decode are const and thread-safe for both kinds, so one tokenizer serves every encoder thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace diloco::tokenize {

struct SpecialIds {
  int bos = -1, eos = -1, newline = -1;  // -1: the model has none
};

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  // Appends the ids of text (no BOS/EOS); "" or the error.
  virtual std::string Encode(std::string_view text, std::vector<int>* ids) const = 0;
  // Appends the ids of text that continues a document whose earlier part was encoded before, cut at a line end (a
  // later work item of a --format text file): nothing is prepended to its start, so the parts' ids together are the
  // whole document's (a SentencePiece model without our "<nl>" symbol: no dummy prefix). "" or the error.
  virtual std::string EncodeContinuation(std::string_view text, std::vector<int>* ids) const {
    return Encode(text, ids);
  }
  // Appends the ids of a prompt with the special tokens transformers' tokenizer(text) adds around it: a
  // tokenizer.json's post-processor (HfTokenizer::EncodeWithSpecialTokens); for a SentencePiece model, the
  // post-processor of a tokenizer.json beside it (transformers 5.25 then reads that file), else the add_bos_token /
  // add_eos_token of the tokenizer_config.json beside it (false when it does not say), else BOS alone (a model
  // diloco-tokenize trained: every document it writes starts with BOS). "" or the error.
  virtual std::string EncodeWithSpecialTokens(std::string_view text, std::vector<int>* ids) const = 0;
  // The text of ids into *text; "" or the error (an id outside the vocabulary).
  virtual std::string Decode(const std::vector<int>& ids, std::string* text) const = 0;
  // The number of ids the tokenizer can produce (one more than its largest id).
  virtual int size() const = 0;
  // The piece an id stands for, as the file names it (a SentencePiece piece; a tokenizer.json token, added or of the
  // model); "" for an id the file leaves out.
  virtual std::string Piece(int id) const = 0;
  // BOS / EOS for documents, and the newline id (-1 when newlines are part of the encoded text).
  virtual SpecialIds special() const = 0;
  // The file name a token cache keeps it under: "tokenizer.model" or "tokenizer.json".
  virtual const char* cache_file_name() const = 0;
};

// The vocabulary digest of a tokenizer: XXH3-64 of its pieces in id order (for each id from 0 to size() - 1: the
// piece's length as 4 little-endian bytes, then its bytes), as 16 lowercase hex digits. Two tokenizers with the same
// digest give every id the same piece, whatever their files' other bytes (a trained SentencePiece model records its
// training settings, thread count included). The coordinator compares its own with each worker's at Join
// (JoinRequest.data, proto/PROTOCOL.md).
std::string VocabDigest(const TextTokenizer& tokenizer);

// Loads a SentencePiece model or a tokenizer.json into *out; "" or one line naming the problem.
std::string LoadTextTokenizer(const std::string& path, std::unique_ptr<TextTokenizer>* out);

// The name a token cache gives the tokenizer file at path ("tokenizer.json" for a .json file, else
// "tokenizer.model").
std::string CacheFileNameOf(const std::string& path);

}  // namespace diloco::tokenize
