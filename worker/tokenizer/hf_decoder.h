// HfDecoder: the "decoder" of a tokenizer.json, turning the tokens of ids back into text as the tokenizers library's
// decode_chain does: ByteLevel (GPT-2's characters back to bytes), Metaspace, Replace (a literal string pattern),
// ByteFallback ("<0xXX>" runs back to UTF-8, U+FFFD per byte when invalid), Fuse, Strip and Sequence of these; without
// a decoder the tokens are joined by spaces. Anything else is refused by Parse with one line naming the component.
// Immutable after Parse; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace diloco::tokenize {

class HfDecoder {
 public:
  // Reads the "decoder" value; "" or the error naming the unsupported component.
  std::string Parse(const nlohmann::json& j);
  // The text of tokens.
  std::string Decode(std::vector<std::string> tokens) const;

 private:
  enum class Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip };
  struct Step {
    Kind kind;
    std::string a, b;         // Metaspace: a = replacement, b = prepend_scheme; Replace: a -> b; Strip: a = content
    int start = 0, stop = 0;  // Strip
  };
  std::string ParseOne(const nlohmann::json& j);
  void Apply(const Step& step, std::vector<std::string>& tokens) const;

  bool present_ = false;
  std::vector<Step> steps_;
};

}  // namespace diloco::tokenize
