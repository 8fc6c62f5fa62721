// HfBpe: the BPE "model" of a tokenizer.json, encoding one pre-tokenized word at a time exactly as the tokenizers
// library's BPE does: the word's characters (for a byte-level tokenizer, the characters GPT-2's map gives its bytes)
// become vocabulary ids, a character outside the vocabulary becomes its UTF-8 bytes as "<0xXX>" tokens
// (byte_fallback) or the unk token (fused when fuse_unk) or nothing, then the pair of lowest merge rank (leftmost
// first) is merged until none is left; ignore_merges takes a word that is in the vocabulary whole. Dropout,
// continuing_subword_prefix and end_of_word_suffix are refused by Parse with one line naming them.
// Immutable after Parse; Encode is thread-safe (its word cache is per thread).
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace diloco::tokenize {

class HfBpe {
 public:
  // Reads the "model" object; "" or the error naming what is not supported.
  std::string Parse(const nlohmann::json& model);
  // Appends the ids of one non-empty word; byte_level: word is raw bytes, seen through GPT-2's byte map.
  void Encode(std::string_view word, bool byte_level, std::vector<int>* ids) const;
  // The id of a vocabulary token, or -1.
  int TokenToId(const std::string& token) const;
  // The token of an id, or nullptr.
  const std::string* IdToToken(int id) const;
  // One more than the largest id of the vocabulary.
  int size() const { return static_cast<int>(tokens_.size()); }

 private:
  struct Merge {
    int rank, new_id;
  };
  static uint64_t PairKey(int a, int b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }
  std::string ParseMerges(const nlohmann::json& merges);
  // The ids of the word's characters before merging (byte fallback and unk applied).
  void InitialIds(std::string_view word, bool byte_level, std::vector<int>* ids) const;
  // Merges ids in place by rank, as tokenizers' Word::merge_all.
  void MergeAll(std::vector<int>* ids) const;
  void EncodeUncached(std::string_view word, bool byte_level, std::vector<int>* ids) const;

  std::unordered_map<std::string, int> vocab_;
  std::vector<std::string> tokens_;  // by id; "" for an unused id
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int, 256> byte_fallback_ids_{};  // "<0xXX>" ids, -1 when missing
  std::array<int, 256> byte_level_ids_{};     // ids of GPT-2's characters for each byte, -1 when missing
  int unk_id_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  uint64_t instance_ = 0;  // tells this model's entries in a thread's word cache from another model's
};

}  // namespace diloco::tokenize
