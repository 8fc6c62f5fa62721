#include "worker/tokenizer/codec.h"

#include <sentencepiece_processor.h>

#include <iostream>
#include <sstream>
#include <vector>

#include "worker/tokenizer/document_encoder.h"
#include "worker/tokenizer/tokenize_error.h"
#include "worker/tokenizer/tokenizer_model.h"

namespace diloco::tokenize {
namespace {

// A prompt's ids: lines joined by the newline id when the model has one (as the shards encode text).
std::string EncodePrompt(const sentencepiece::SentencePieceProcessor& sp, const std::string& text,
                         std::vector<int>* ids) {
  const int newline_id = SpecialIdsOf(sp).newline;
  if (newline_id < 0) {
    const auto status = sp.Encode(text, ids);
    return status.ok() ? "" : status.ToString();
  }
  size_t begin = 0;
  while (true) {
    const size_t end = text.find('\n', begin);
    std::vector<int> piece_ids;
    const auto status =
        sp.Encode(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin), &piece_ids);
    if (!status.ok()) return status.ToString();
    ids->insert(ids->end(), piece_ids.begin(), piece_ids.end());
    if (end == std::string::npos) return "";
    ids->push_back(newline_id);
    begin = end + 1;
  }
}

// The text of ids; our newline symbol becomes '\n' (a byte piece "<0x0A>" decodes to it by itself).
std::string DecodeIds(const sentencepiece::SentencePieceProcessor& sp, const std::vector<int>& ids, std::string* text) {
  const int newline_id = sp.PieceToId(kNewlineSymbol);
  std::vector<int> line;
  auto flush = [&]() -> std::string {
    std::string piece;
    const auto status = sp.Decode(line, &piece);
    if (!status.ok()) return status.ToString();
    *text += piece;
    line.clear();
    return "";
  };
  for (int id : ids) {
    if (id < 0 || id >= sp.GetPieceSize()) return "token id " + std::to_string(id) + " is not in the vocabulary";
    if (id == newline_id && newline_id != sp.unk_id()) {
      if (std::string e = flush(); !e.empty()) return e;
      *text += "\n";
    } else {
      line.push_back(id);
    }
  }
  return flush();
}

}  // namespace

int RunCodec(bool encode, const std::string& model_path, const std::string& input) {
  sentencepiece::SentencePieceProcessor sp;
  const auto loaded = sp.Load(model_path);
  if (!loaded.ok()) throw TokenizeError("cannot load the tokenizer " + model_path + ": " + loaded.ToString());
  if (encode) {
    std::vector<int> ids;
    if (std::string e = EncodePrompt(sp, input, &ids); !e.empty()) throw TokenizeError("encoding failed: " + e);
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
  if (std::string e = DecodeIds(sp, ids, &text); !e.empty()) throw TokenizeError("decoding failed: " + e);
  std::cout << text;
  return 0;
}

}  // namespace diloco::tokenize
