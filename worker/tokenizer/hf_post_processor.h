// HfPostProcessor: the special tokens a tokenizer.json's "post_processor" puts around one text when the tokenizers
// library encodes it with add_special_tokens=True, as transformers' tokenizer(text) does for a prompt:
// TemplateProcessing's "single" template (the ids of its special tokens before $A, and after it), RobertaProcessing and
// BertProcessing (cls before, sep after), ByteLevel (none: it only trims offsets) and a Sequence of these, each
// wrapping what the ones before it made. None without a post_processor. Any other type, or a template naming a special
// token it does not list, is refused by Parse with one line naming it. Immutable after Parse; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace diloco::tokenize {

class HfPostProcessor {
 public:
  // Reads the "post_processor" value (null: none); "" or the error naming what is not understood.
  std::string Parse(const nlohmann::json& j);
  // The ids added before the text's own ids, and after them.
  const std::vector<int>& prefix() const { return prefix_; }
  const std::vector<int>& suffix() const { return suffix_; }

 private:
  std::string ParseOne(const nlohmann::json& j);

  std::vector<int> prefix_, suffix_;
};

}  // namespace diloco::tokenize
