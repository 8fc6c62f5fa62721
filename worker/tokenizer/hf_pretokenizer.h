// HfPreTokenizer: the "pre_tokenizer" of a tokenizer.json, which cuts a normalized piece of text into the words the
// BPE model encodes one by one. Implemented as the tokenizers library defines them: ByteLevel (GPT-2's regex when
// use_regex, a space in front when add_prefix_space; the words are then mapped byte -> character, byte_level()),
// Split with a Regex or String pattern and the behaviours Isolated or Removed (Llama 3, Qwen2), Metaspace (replacement,
// prepend_scheme always / first / never, split) and Sequence of these, ByteLevel last. Anything else is refused by
// Parse with one line naming the component. Immutable after Parse; ForEachWord is thread-safe.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "worker/tokenizer/hf_regex.h"

namespace diloco::tokenize {

class HfPreTokenizer {
 public:
  // Reads the "pre_tokenizer" value; "" or the error naming the unsupported component.
  std::string Parse(const nlohmann::json& j);
  // Calls on_word for each word of piece in order; at_start: the piece begins the input (Metaspace "first");
  // continued: the piece continues text handed in before (a later work item of a document), so neither Metaspace
  // nor ByteLevel's add_prefix_space puts anything in front of its first word.
  void ForEachWord(const std::string& piece, bool at_start, bool continued,
                   const std::function<void(std::string_view)>& on_word) const;
  // The words are raw bytes the model sees through GPT-2's byte-to-character map (a ByteLevel step ran).
  bool byte_level() const { return byte_level_; }

 private:
  enum class Kind { kRegexSplit, kByteLevelPrefix, kMetaspace };
  struct Step {
    Kind kind;
    HfRegex regex;            // kRegexSplit
    bool removed = false;     // kRegexSplit: the matches are dropped (behavior Removed), else kept (Isolated)
    std::string replacement;  // kMetaspace
    std::string prepend;      // kMetaspace: always | first | never
    bool split = false;       // kMetaspace
  };
  struct Piece {
    std::string text;
    bool first;              // begins the input
    bool continued = false;  // begins a continuation of earlier text: no prefix
  };
  std::string ParseOne(const nlohmann::json& j);
  void Apply(const Step& step, std::vector<Piece>& pieces) const;

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace diloco::tokenize
