#include "worker/tokenizer/codec.h"

#include <iostream>
#include <memory>
#include <sstream>
#include <vector>

#include "worker/tokenizer/text_tokenizer.h"
#include "worker/tokenizer/tokenize_error.h"

namespace diloco::tokenize {

int RunCodec(bool encode, const std::string& model_path, const std::string& input, bool add_special_tokens) {
  std::unique_ptr<TextTokenizer> tokenizer;
  ThrowIfError(LoadTextTokenizer(model_path, &tokenizer));
  if (encode) {
    std::vector<int> ids;
    const std::string e =
        add_special_tokens ? tokenizer->EncodeWithSpecialTokens(input, &ids) : tokenizer->Encode(input, &ids);
    if (!e.empty()) throw TokenizeError("encoding failed: " + e);
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
    return 0;
  }
  std::vector<int> ids;
  std::istringstream in(input);
  for (std::string word; in >> word;) {
    try {
      ids.push_back(std::stoi(word));
    } catch (const std::exception&) {
      throw TokenizeError("--ids: '" + word + "' is not a token id");
    }
  }
  std::string text;
  if (std::string e = tokenizer->Decode(ids, &text); !e.empty()) throw TokenizeError("decoding failed: " + e);
  std::cout << text;
  return 0;
}

int RunDigest(const std::string& model_path) {
  std::unique_ptr<TextTokenizer> tokenizer;
  ThrowIfError(LoadTextTokenizer(model_path, &tokenizer));
  std::cout << VocabDigest(*tokenizer) << "\n";
  return 0;
}

}  // namespace diloco::tokenize
