// HfNormalizer: the "normalizer" of a tokenizer.json, applied to each piece of text between added tokens before
// pre-tokenization, as the tokenizers library does. Implemented: null, Sequence, Prepend, Replace (a literal string
// pattern) and NFC (ICU) — what Llama 2 / Mistral converted files (Prepend "▁", Replace " " -> "▁") and Qwen2 (NFC)
// ship. Anything else is refused by Parse with one line naming the component. Immutable after Parse; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace diloco::tokenize {

class HfNormalizer {
 public:
  // Reads the "normalizer" value; "" or the error naming the unsupported component.
  std::string Parse(const nlohmann::json& j);
  // Normalizes a non-empty piece in place. continued: the piece continues text normalized before (a later work item
  // of a document), so Prepend adds nothing.
  void Apply(std::string* text, bool continued = false) const;

 private:
  enum class Kind { kPrepend, kReplace, kNfc };
  struct Step {
    Kind kind;
    std::string from, to;  // Prepend: to; Replace: from -> to
  };
  std::string ParseOne(const nlohmann::json& j);

  std::vector<Step> steps_;
};

}  // namespace diloco::tokenize
