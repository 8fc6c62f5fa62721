#include "worker/tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "worker/tokenizer/hf_text.h"

namespace diloco::tokenize {
namespace {

// Whether the code point before `pos` (after: at `pos`) is a word character, as the tokenizers library tells a
// single_word token's neighbours (Unicode letters and numbers, '_'); false at the text's ends.
bool WordBefore(std::string_view text, size_t pos) {
  size_t n = 0;
  return pos > 0 && IsWordChar(CodePointBefore(text, pos, &n));
}
bool WordAt(std::string_view text, size_t pos) {
  size_t n = 0;
  return pos < text.size() && IsWordChar(CodePointAt(text, pos, &n));
}

// A JSON file, or null when it is missing or not JSON.
nlohmann::json ReadJsonFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    return nullptr;
  }
}

// An id from config.json (an integer, or the first of a list), or -2 when the key says nothing.
int ConfigId(const nlohmann::json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return -2;
  const auto& v = config.at(key);
  if (v.is_number_integer()) return v.get<int>();
  if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int>();
  return -2;
}

// A token named by tokenizer_config.json (a string or {"content": ...}), or "".
std::string ConfigToken(const nlohmann::json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return "";
  const auto& v = config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content");
  return "";
}

}  // namespace

bool IsTokenizerJson(const std::string& path) { return std::filesystem::path(path).extension() == ".json"; }

std::string HfTokenizer::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "cannot read the tokenizer " + path;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (!j.is_object() || !j.contains("model")) return path + ": not a tokenizer.json (no \"model\")";
    std::string e = model_.Parse(j.at("model"));
    if (e.empty()) e = normalizer_.Parse(j.value("normalizer", nlohmann::json()));
    if (e.empty()) e = pre_tokenizer_.Parse(j.value("pre_tokenizer", nlohmann::json()));
    if (e.empty()) e = decoder_.Parse(j.value("decoder", nlohmann::json()));
    if (e.empty()) e = LoadAddedTokens(j.value("added_tokens", nlohmann::json::array()));
    if (!e.empty()) return path + ": " + e;
    // Only a prompt encoded with its special tokens needs the post-processor: training text does not, so a file whose
    // post-processor is not understood still loads, and says so where it is needed.
    post_processor_error_ = post_processor_.Parse(j.value("post_processor", nlohmann::json()));
    if (!post_processor_error_.empty()) post_processor_error_ = path + ": " + post_processor_error_;
    LoadSpecialIds(std::filesystem::path(path).parent_path().string());
  } catch (const nlohmann::json::exception& e) {
    return path + ": not a valid tokenizer.json (" + e.what() + ")";
  }
  return "";
}

std::string HfTokenizer::LoadAddedTokens(const nlohmann::json& added) {
  size_ = model_.size();
  for (const auto& a : added) {
    AddedToken t;
    t.content = a.at("content").get<std::string>();
    t.id = a.at("id").get<int>();
    t.special = a.value("special", false);
    t.normalized = a.value("normalized", !t.special);
    t.match = t.content;
    if (t.normalized) normalizer_.Apply(&t.match);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.single_word = a.value("single_word", false);
    if (t.id < 0) return "the added token '" + t.content + "' has a negative id";
    size_ = std::max(size_, t.id + 1);
    added_by_id_[t.id] = static_cast<int>(added_.size());
    if (!t.match.empty()) added_by_first_byte_[static_cast<unsigned char>(t.match[0])].push_back(added_.size());
    added_.push_back(std::move(t));
  }
  for (auto& list : added_by_first_byte_) {
    std::stable_sort(list.begin(), list.end(),
                     [&](int a, int b) { return added_[a].match.size() > added_[b].match.size(); });
  }
  return "";
}

void HfTokenizer::LoadSpecialIds(const std::string& dir) {
  const nlohmann::json config = ReadJsonFile(std::filesystem::path(dir) / "config.json");
  const nlohmann::json tokenizer_config = ReadJsonFile(std::filesystem::path(dir) / "tokenizer_config.json");
  // The post-processor's first special token before the text, and after it.
  const int template_ids[2] = {post_processor_.prefix().empty() ? -1 : post_processor_.prefix().front(),
                               post_processor_.suffix().empty() ? -1 : post_processor_.suffix().front()};
  const char* id_keys[2] = {"bos_token_id", "eos_token_id"};
  const char* token_keys[2] = {"bos_token", "eos_token"};
  int* out[2] = {&bos_id_, &eos_id_};
  for (int k = 0; k < 2; ++k) {
    int id = ConfigId(config, id_keys[k]);
    if (id == -2) {
      const std::string token = ConfigToken(tokenizer_config, token_keys[k]);
      id = token.empty() ? template_ids[k] : TokenToId(token);
    }
    *out[k] = id >= 0 && id < size_ ? id : -1;
  }
}

std::string HfTokenizer::EncodeWithSpecialTokens(std::string_view text, std::vector<int>* ids) const {
  if (!post_processor_error_.empty()) return post_processor_error_;
  ids->insert(ids->end(), post_processor_.prefix().begin(), post_processor_.prefix().end());
  Encode(text, ids);
  ids->insert(ids->end(), post_processor_.suffix().begin(), post_processor_.suffix().end());
  return "";
}

int HfTokenizer::TokenToId(const std::string& token) const {
  for (const AddedToken& t : added_) {
    if (t.content == token) return t.id;
  }
  return model_.TokenToId(token);
}

std::string HfTokenizer::IdToToken(int id) const {
  if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) return added_[it->second].match;
  const std::string* token = model_.IdToToken(id);
  return token != nullptr ? *token : std::string();
}

const HfTokenizer::AddedToken* HfTokenizer::MatchAdded(std::string_view text, size_t at, size_t floor, bool normalized,
                                                       size_t* begin, size_t* end) const {
  for (int index : added_by_first_byte_[static_cast<unsigned char>(text[at])]) {
    const AddedToken& t = added_[index];
    if (t.normalized != normalized || text.compare(at, t.match.size(), t.match) != 0) continue;
    size_t b = at, e = at + t.match.size();
    if (t.single_word && (WordBefore(text, b) || WordAt(text, e))) continue;
    size_t n = 0;
    if (t.lstrip) {  // Unicode whitespace (U+3000, NBSP, ...), as the library strips it
      while (b > floor && IsWhiteSpace(CodePointBefore(text, b, &n))) b -= n;
    }
    if (t.rstrip) {
      while (e < text.size() && IsWhiteSpace(CodePointAt(text, e, &n))) e += n;
    }
    *begin = b;
    *end = e;
    return &t;
  }
  return nullptr;
}

void HfTokenizer::SplitAdded(std::string_view text, bool normalized, std::vector<int>* ids,
                             const std::function<void(std::string_view, bool)>& on_piece) const {
  size_t piece = 0;  // start of the text not yet handed out
  for (size_t at = 0; at < text.size(); ++at) {
    if (added_by_first_byte_[static_cast<unsigned char>(text[at])].empty()) continue;
    size_t begin = 0, end = 0;
    const AddedToken* t = MatchAdded(text, at, piece, normalized, &begin, &end);
    if (t == nullptr) continue;
    if (begin > piece) on_piece(text.substr(piece, begin - piece), piece == 0);
    ids->push_back(t->id);
    piece = end;
    at = end - 1;
  }
  if (piece < text.size()) on_piece(text.substr(piece), piece == 0);
}

void HfTokenizer::EncodePiece(std::string_view piece, bool at_start, bool continued, std::vector<int>* ids) const {
  std::string text(piece);
  normalizer_.Apply(&text, continued);
  const bool byte_level = pre_tokenizer_.byte_level();
  SplitAdded(text, true, ids, [&](std::string_view part, bool leading) {
    const std::string word_text(part);
    pre_tokenizer_.ForEachWord(word_text, at_start && leading, continued && leading,
                               [&](std::string_view word) { model_.Encode(word, byte_level, ids); });
  });
}

void HfTokenizer::Encode(std::string_view input, std::vector<int>* ids, bool continues) const {
  std::string repaired;
  std::string_view text = input;
  if (!IsValidUtf8(input)) {
    repaired = RepairUtf8(input);
    text = repaired;
  }
  SplitAdded(text, false, ids, [&](std::string_view piece, bool leading) {
    EncodePiece(piece, leading && !continues, leading && continues, ids);
  });
}

std::string HfTokenizer::Decode(const std::vector<int>& ids, std::string* error) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int id : ids) {
    if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      if (!added_[it->second].special) tokens.push_back(added_[it->second].match);
      continue;
    }
    const std::string* token = model_.IdToToken(id);
    if (token == nullptr) {
      *error = "token id " + std::to_string(id) + " is not in the vocabulary";
      return "";
    }
    tokens.push_back(*token);
  }
  return decoder_.Decode(std::move(tokens));
}

}  // namespace diloco::tokenize
