#include "worker/tokenizer/text_tokenizer.h"

#include <sentencepiece_processor.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "worker/tokenizer/hf_post_processor.h"
#include "worker/tokenizer/hf_tokenizer.h"
#include "worker/tokenizer/tokenizer_model.h"

namespace diloco::tokenize {
namespace {

// A SentencePiece model. One diloco-tokenize trained (it has our "<nl>" symbol: its trainer normalises '\n' away):
// lines encoded one by one and joined by that symbol. Any other (Llama 2's, Mistral's tokenizer.model): the whole
// text in one call, as the sentencepiece library and transformers encode it; before, it was encoded line by line too
// and every line but the first got the model's dummy prefix "▁" that the library puts only at the text's start.
class SentencePieceTokenizer : public TextTokenizer {
 public:
  std::string Load(const std::string& path) {
    const auto loaded = sp_.Load(path);
    if (!loaded.ok()) return "cannot load the tokenizer " + path + ": " + loaded.ToString();
    special_.bos = sp_.bos_id() >= 0 ? sp_.bos_id() : -1;
    special_.eos = sp_.eos_id() >= 0 ? sp_.eos_id() : -1;
    for (const char* piece : {kNewlineSymbol, "<0x0A>"}) {
      const int id = sp_.PieceToId(piece);
      if (id != sp_.unk_id()) {
        special_.newline = id;
        break;
      }
    }
    newline_symbol_ = sp_.PieceToId(kNewlineSymbol);
    by_lines_ = newline_symbol_ != sp_.unk_id();
    if (!by_lines_) {  // the ids "\n" starts a text with: a continuation is encoded after a "\n" that they are cut off
      const auto status = sp_.Encode("\n", &newline_ids_);
      if (!status.ok()) return "cannot encode a newline with the tokenizer " + path + ": " + status.ToString();
    }
    prompt_error_ = LoadPromptSpecials(std::filesystem::path(path).parent_path());
    return "";
  }

  std::string Encode(std::string_view text, std::vector<int>* ids) const override {
    thread_local std::vector<int> piece_ids;
    if (!by_lines_) {
      const auto status = sp_.Encode(text, &piece_ids);
      if (!status.ok()) return status.ToString();
      ids->insert(ids->end(), piece_ids.begin(), piece_ids.end());
      return "";
    }
    const char* const end = text.data() + text.size();
    for (const char* line = text.data(); line < end;) {
      const char* nl = static_cast<const char*>(memchr(line, '\n', end - line));
      const char* line_end = nl != nullptr ? nl : end;
      if (line_end > line) {
        const auto status = sp_.Encode(std::string_view(line, line_end - line), &piece_ids);
        if (!status.ok()) return status.ToString();
        ids->insert(ids->end(), piece_ids.begin(), piece_ids.end());
      }
      if (nl == nullptr) break;
      if (special_.newline >= 0) ids->push_back(special_.newline);
      line = nl + 1;
    }
    return "";
  }

  // Text that continues a document after a line end (a later work item): a model encoded by lines has nothing to
  // add; else the text is encoded after a "\n" whose ids (with the dummy prefix) are then cut off, so that the
  // items' ids together are the whole document's. Where they do not come first (a piece across the "\n"), the text
  // is encoded alone.
  std::string EncodeContinuation(std::string_view text, std::vector<int>* ids) const override {
    if (by_lines_ || newline_ids_.empty()) return Encode(text, ids);
    thread_local std::vector<int> piece_ids;
    std::string after_newline;
    after_newline.reserve(text.size() + 1);
    after_newline.append("\n").append(text);
    const auto status = sp_.Encode(after_newline, &piece_ids);
    if (!status.ok()) return status.ToString();
    if (piece_ids.size() < newline_ids_.size() ||
        !std::equal(newline_ids_.begin(), newline_ids_.end(), piece_ids.begin())) {
      return Encode(text, ids);
    }
    ids->insert(ids->end(), piece_ids.begin() + static_cast<std::ptrdiff_t>(newline_ids_.size()), piece_ids.end());
    return "";
  }

  std::string EncodeWithSpecialTokens(std::string_view text, std::vector<int>* ids) const override {
    if (!prompt_error_.empty()) return prompt_error_;
    ids->insert(ids->end(), prefix_.begin(), prefix_.end());
    if (std::string e = Encode(text, ids); !e.empty()) return e;
    ids->insert(ids->end(), suffix_.begin(), suffix_.end());
    return "";
  }

  // Our newline symbol becomes '\n' (a byte piece "<0x0A>" decodes to it by itself).
  std::string Decode(const std::vector<int>& ids, std::string* text) const override {
    std::vector<int> line;
    auto flush = [&]() -> std::string {
      std::string piece;
      const auto status = sp_.Decode(line, &piece);
      if (!status.ok()) return status.ToString();
      *text += piece;
      line.clear();
      return "";
    };
    for (int id : ids) {
      if (id < 0 || id >= sp_.GetPieceSize()) return "token id " + std::to_string(id) + " is not in the vocabulary";
      if (id == newline_symbol_ && newline_symbol_ != sp_.unk_id()) {
        if (std::string e = flush(); !e.empty()) return e;
        *text += "\n";
      } else {
        line.push_back(id);
      }
    }
    return flush();
  }

  int size() const override { return sp_.GetPieceSize(); }
  std::string Piece(int id) const override { return sp_.IdToPiece(id); }
  SpecialIds special() const override { return special_; }
  const char* cache_file_name() const override { return "tokenizer.model"; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  SpecialIds special_;
  int newline_symbol_ = -1;
  bool by_lines_ = true;              // the model has our "<nl>" symbol: Encode goes line by line
  std::vector<int> newline_ids_;      // !by_lines_: the ids of "\n" alone (EncodeContinuation)
  std::vector<int> prefix_, suffix_;  // a prompt's special tokens (EncodeWithSpecialTokens)
  std::string prompt_error_;          // why the file naming them could not be read; "" when it was

  // prefix_ / suffix_ as transformers 5.25 makes them for the model's directory (`dir`): from a tokenizer.json beside
  // the model, its post-processor (transformers then reads that file, whatever tokenizer_config.json says); else
  // tokenizer_config.json's add_bos_token / add_eos_token (false when it does not say); else, with neither (a model
  // diloco-tokenize trained: its documents start with BOS), BOS. "" or what is wrong with the file (training text
  // does not need it, so only a prompt reports it).
  std::string LoadPromptSpecials(const std::filesystem::path& dir) {
    auto read = [](const std::filesystem::path& path, nlohmann::json* out) {
      std::ifstream in(path);
      if (!in) return false;
      *out = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      return true;
    };
    nlohmann::json j;
    if (read(dir / "tokenizer.json", &j)) {
      if (!j.is_object()) return (dir / "tokenizer.json").string() + ": not a JSON object";
      HfPostProcessor post;
      if (std::string e = post.Parse(j.value("post_processor", nlohmann::json())); !e.empty()) {
        return (dir / "tokenizer.json").string() + ": " + e;
      }
      prefix_ = post.prefix();
      suffix_ = post.suffix();
      return "";
    }
    if (!read(dir / "tokenizer_config.json", &j)) {
      if (special_.bos >= 0) prefix_ = {special_.bos};
      return "";
    }
    const std::string path = (dir / "tokenizer_config.json").string();
    if (!j.is_object()) return path + ": not a JSON object";
    for (auto [key, out, id] :
         {std::tuple{"add_bos_token", &prefix_, special_.bos}, std::tuple{"add_eos_token", &suffix_, special_.eos}}) {
      if (!j.contains(key)) continue;
      if (!j.at(key).is_boolean()) return path + ": " + key + " must be true or false";
      if (j.at(key).get<bool>() && id >= 0) *out = {id};
    }
    return "";
  }
};

// A tokenizer.json: the whole text at once, newlines included.
class JsonTokenizer : public TextTokenizer {
 public:
  std::string Load(const std::string& path) { return hf_.Load(path); }
  std::string Encode(std::string_view text, std::vector<int>* ids) const override {
    hf_.Encode(text, ids);
    return "";
  }
  std::string EncodeContinuation(std::string_view text, std::vector<int>* ids) const override {
    hf_.Encode(text, ids, /*continues=*/true);
    return "";
  }
  std::string EncodeWithSpecialTokens(std::string_view text, std::vector<int>* ids) const override {
    return hf_.EncodeWithSpecialTokens(text, ids);
  }
  std::string Decode(const std::vector<int>& ids, std::string* text) const override {
    std::string error;
    *text += hf_.Decode(ids, &error);
    return error;
  }
  int size() const override { return hf_.size(); }
  std::string Piece(int id) const override { return hf_.IdToToken(id); }
  SpecialIds special() const override { return {hf_.bos_id(), hf_.eos_id(), -1}; }
  const char* cache_file_name() const override { return "tokenizer.json"; }

 private:
  HfTokenizer hf_;
};

}  // namespace

std::string VocabDigest(const TextTokenizer& tokenizer) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (int id = 0; id < tokenizer.size(); ++id) {
    const std::string piece = tokenizer.Piece(id);
    const uint32_t n = static_cast<uint32_t>(piece.size());
    const unsigned char length[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                                     static_cast<unsigned char>(n >> 16), static_cast<unsigned char>(n >> 24)};
    XXH3_64bits_update(state, length, sizeof(length));
    XXH3_64bits_update(state, piece.data(), piece.size());
  }
  const unsigned long long digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", digest);
  return hex;
}

std::string CacheFileNameOf(const std::string& path) {
  return IsTokenizerJson(path) ? "tokenizer.json" : "tokenizer.model";
}

std::string LoadTextTokenizer(const std::string& path, std::unique_ptr<TextTokenizer>* out) {
  if (IsTokenizerJson(path)) {
    auto json = std::make_unique<JsonTokenizer>();
    if (std::string e = json->Load(path); !e.empty()) return e;
    *out = std::move(json);
    return "";
  }
  auto sp = std::make_unique<SentencePieceTokenizer>();
  if (std::string e = sp->Load(path); !e.empty()) return e;
  *out = std::move(sp);
  return "";
}

}  // namespace diloco::tokenize
