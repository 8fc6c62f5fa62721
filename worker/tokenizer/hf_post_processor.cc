#include "worker/tokenizer/hf_post_processor.h"

namespace diloco::tokenize {
namespace {

// A ["token", id] pair of RobertaProcessing / BertProcessing (cls, sep): its id, or -1 when it is not one.
int PairId(const nlohmann::json& pair) {
  if (!pair.is_array() || pair.size() != 2 || !pair[1].is_number_integer()) return -1;
  return pair[1].get<int>();
}

}  // namespace

std::string HfPostProcessor::Parse(const nlohmann::json& j) {
  prefix_.clear();
  suffix_.clear();
  if (j.is_null()) return "";
  std::string e;
  try {
    e = ParseOne(j);
  } catch (const nlohmann::json::exception& ex) {  // an item or id of the wrong JSON type
    e = std::string("post_processor: ") + ex.what();
  }
  if (!e.empty()) {  // nothing half read: no special tokens at all
    prefix_.clear();
    suffix_.clear();
  }
  return e;
}

std::string HfPostProcessor::ParseOne(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("type") || !j.at("type").is_string())
    return "post_processor: not an object with a type";
  const std::string type = j.at("type").get<std::string>();
  if (type == "ByteLevel") return "";
  if (type == "Sequence") {
    for (const auto& p : j.value("processors", nlohmann::json::array())) {
      if (std::string e = ParseOne(p); !e.empty()) return e;
    }
    return "";
  }
  std::vector<int> before, after;
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    const int cls = PairId(j.value("cls", nlohmann::json())), sep = PairId(j.value("sep", nlohmann::json()));
    if (cls < 0 || sep < 0) return "post_processor " + type + ": cls and sep must be [token, id] pairs";
    before = {cls};
    after = {sep};
  } else if (type == "TemplateProcessing") {
    const nlohmann::json specials = j.value("special_tokens", nlohmann::json::object());
    bool seen_text = false;
    for (const auto& item : j.value("single", nlohmann::json::array())) {
      if (item.contains("Sequence")) {
        seen_text = true;
        continue;
      }
      if (!item.contains("SpecialToken"))
        return "post_processor TemplateProcessing: an item is neither a SpecialToken nor a Sequence";
      const std::string name = item.at("SpecialToken").value("id", "");
      if (!specials.contains(name) || !specials.at(name).contains("ids")) {
        return "post_processor TemplateProcessing: the template names '" + name +
               "', which special_tokens does not list";
      }
      for (const auto& id : specials.at(name).at("ids")) (seen_text ? after : before).push_back(id.get<int>());
    }
  } else {
    return "post_processor " + type +
           " is not implemented (TemplateProcessing, RobertaProcessing, BertProcessing, "
           "ByteLevel and Sequence are)";
  }
  prefix_.insert(prefix_.begin(), before.begin(), before.end());  // wraps what the processors before it added
  suffix_.insert(suffix_.end(), after.begin(), after.end());
  return "";
}

}  // namespace diloco::tokenize
