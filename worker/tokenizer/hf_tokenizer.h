// HfTokenizer: a Hugging Face tokenizer.json (the tokenizers library's format) loaded in C++, so the daemon and
// diloco-tokenize stay free of Python. Encode(text) gives exactly Tokenizer.encode(text, add_special_tokens=False).ids
// for the kinds the models we import ship: BPE with the ByteLevel pre-tokenizer (GPT-2), with a Split regex before
// ByteLevel (Llama 3, Qwen2; NFC normalizer), and with byte_fallback under Metaspace or the Prepend + Replace
// normalizer (Llama 2 / Mistral converted files). The file's added tokens are cut out of the text as the tokenizers
// library does (leftmost, longest; lstrip / rstrip / single_word honoured): those with normalized: false from the raw
// text, then the pieces between are normalized (hf_normalizer.h) and those with normalized: true are cut from each
// normalized piece, in their normalized form (which is also the text they decode to); what is left is pre-tokenized
// (hf_pretokenizer.h) and encoded word by word (hf_bpe.h). Invalid UTF-8 input is read as U+FFFD, as a lossy decode
// would. Decode goes through the file's decoder (hf_decoder.h), skipping special tokens as tokenizers' decode does by
// default. WordPiece, Unigram, WordLevel and any normalizer, pre-tokenizer or decoder not listed in those headers are
// refused by Load with one line naming it. BOS / EOS (for documents in the token cache) come from the model's config
// next to the file: config.json's bos_token_id / eos_token_id (the first of a list), else tokenizer_config.json's
// bos_token / eos_token, else the post-processor's first special token before the text / after it; -1 when none
// says. EncodeWithSpecialTokens adds the post-processor's special tokens, as transformers' tokenizer(text) does.
// Immutable after Load; Encode and Decode are thread-safe.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "worker/tokenizer/hf_bpe.h"
#include "worker/tokenizer/hf_decoder.h"
#include "worker/tokenizer/hf_normalizer.h"
#include "worker/tokenizer/hf_post_processor.h"
#include "worker/tokenizer/hf_pretokenizer.h"

namespace diloco::tokenize {

class HfTokenizer {
 public:
  // Loads a tokenizer.json and the BOS / EOS of its directory; "" or one line naming the problem.
  std::string Load(const std::string& path);
  // Appends the ids of text, with no special tokens added. continues: text continues a document whose earlier part
  // was encoded before (a later work item, cut at a line end): nothing is prepended to its start (Prepend, Metaspace,
  // add_prefix_space), so the items' ids together are those of one Encode of the whole document.
  void Encode(std::string_view text, std::vector<int>* ids, bool continues = false) const;
  // Appends the ids of text between the special tokens the post-processor adds (hf_post_processor.h), as
  // Tokenizer.encode(text).ids (add_special_tokens=True) gives them; "" or the error when the post-processor was not
  // understood.
  std::string EncodeWithSpecialTokens(std::string_view text, std::vector<int>* ids) const;
  // The text of ids (special tokens skipped); "" and *error set when an id is not in the vocabulary.
  std::string Decode(const std::vector<int>& ids, std::string* error) const;
  // The id of a token (added or in the model), or -1.
  int TokenToId(const std::string& token) const;
  // The token of an id as tokenizers' id_to_token gives it: an added token's content, normalized when the token is
  // (its match: "sword" under a Prepend normalizer is "▁sword"), else the model's token; "" when no token has it.
  std::string IdToToken(int id) const;
  // One more than the largest id (model or added token).
  int size() const { return size_; }
  int bos_id() const { return bos_id_; }
  int eos_id() const { return eos_id_; }

 private:
  struct AddedToken {
    std::string content;
    std::string match;  // what is matched and decoded: content, normalized when the token is normalized
    int id = -1;
    bool special = false, normalized = false, lstrip = false, rstrip = false, single_word = false;
  };
  std::string LoadAddedTokens(const nlohmann::json& added);
  void LoadSpecialIds(const std::string& dir);
  // The added token of the given normalized flag matching at text[at] (longest first), its match [*begin, *end)
  // with stripped spaces (not before floor); or nullptr.
  const AddedToken* MatchAdded(std::string_view text, size_t at, size_t floor, bool normalized, size_t* begin,
                               size_t* end) const;
  // Cuts text at the added tokens of the given normalized flag: on_piece(piece, leading) for each piece between
  // them (leading: the piece starts text), their ids into *ids in order.
  void SplitAdded(std::string_view text, bool normalized, std::vector<int>* ids,
                  const std::function<void(std::string_view, bool)>& on_piece) const;
  // Encodes one piece between non-normalized added tokens; at_start: it begins the input; continued: it continues
  // text encoded before (Encode's continues).
  void EncodePiece(std::string_view piece, bool at_start, bool continued, std::vector<int>* ids) const;

  HfNormalizer normalizer_;
  HfPreTokenizer pre_tokenizer_;
  HfBpe model_;
  HfDecoder decoder_;
  HfPostProcessor post_processor_;
  std::string post_processor_error_;  // why the post-processor was not understood; "" when it was
  std::vector<AddedToken> added_;
  std::array<std::vector<int>, 256> added_by_first_byte_;  // indices into added_, longest content first
  std::unordered_map<int, int> added_by_id_;               // id -> index into added_
  int size_ = 0, bos_id_ = -1, eos_id_ = -1;
};

// True when path names a tokenizer.json (by its .json extension) rather than a SentencePiece model.
bool IsTokenizerJson(const std::string& path);

}  // namespace diloco::tokenize
