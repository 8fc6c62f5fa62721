#include "worker/tokenizer/document_encoder.h"

#include <cstring>
#include <nlohmann/json.hpp>

namespace diloco::tokenize {
namespace {

bool Blank(const char* begin, const char* end) {
  for (const char* p = begin; p < end; ++p) {
    if (*p != ' ' && *p != '\t' && *p != '\r') return false;
  }
  return true;
}

}  // namespace

DocumentEncoder::DocumentEncoder(const TextTokenizer& tokenizer, InputFormat format, std::string jsonl_field,
                                 bool skip_bad_records)
    : tokenizer_(tokenizer),
      special_(tokenizer.special()),
      format_(format),
      jsonl_field_(std::move(jsonl_field)),
      skip_bad_records_(skip_bad_records) {}

bool DocumentEncoder::EncodeLines(const char* begin, const char* end, bool continues, EncodedItem* out) const {
  thread_local std::vector<int> ids;
  ids.clear();
  const std::string_view text(begin, end - begin);
  if (std::string e = continues ? tokenizer_.EncodeContinuation(text, &ids) : tokenizer_.Encode(text, &ids);
      !e.empty()) {
    out->error = "encoding failed: " + e;
    return false;
  }
  out->ids.insert(out->ids.end(), ids.begin(), ids.end());
  return true;
}

void DocumentEncoder::EncodeJsonl(const WorkItem& item, const std::string& path, EncodedItem* out) const {
  const char* const end = item.text.data() + item.text.size();
  uint64_t line_number = item.first_line;
  for (const char* line = item.text.data(); line < end; ++line_number) {
    const char* nl = static_cast<const char*>(memchr(line, '\n', end - line));
    const char* line_end = nl != nullptr ? nl : end;
    std::string bad;
    if (!Blank(line, line_end)) {
      try {
        const nlohmann::json record = nlohmann::json::parse(line, line_end);
        const auto field = record.is_object() ? record.find(jsonl_field_) : record.end();
        if (!record.is_object() || field == record.end() || !field->is_string()) {
          bad = record.is_object() ? "no string field '" + jsonl_field_ + "' (set data.jsonl_field)"
                                   : "not a JSON object";
        } else {
          const std::string& doc = field->get_ref<const std::string&>();
          if (special_.bos >= 0) out->ids.push_back(static_cast<uint32_t>(special_.bos));
          if (!EncodeLines(doc.data(), doc.data() + doc.size(), /*continues=*/false, out)) return;
          if (special_.eos >= 0) out->ids.push_back(static_cast<uint32_t>(special_.eos));
          ++out->documents;
        }
      } catch (const nlohmann::json::exception& e) {
        bad = std::string("not JSON (") + e.what() + ")";
      }
    }
    if (!bad.empty()) {
      if (!skip_bad_records_) {
        out->error = path + ":" + std::to_string(line_number) + ": " + bad +
                     "; fix or remove the line, or set data.on_bad_record: skip";
        return;
      }
      ++out->bad_records;
    }
    line = line_end + 1;
  }
}

void DocumentEncoder::Encode(const WorkItem& item, const std::string& path, EncodedItem* out) const {
  out->seq = item.seq;
  out->ids.clear();
  out->documents = out->bad_records = 0;
  out->bytes = item.text.size();
  out->error.clear();
  out->next = item.next;
  if (format_ == InputFormat::kJsonl) {
    EncodeJsonl(item, path, out);
    return;
  }
  if (item.document_start) {
    out->documents = 1;
    if (special_.bos >= 0) out->ids.push_back(static_cast<uint32_t>(special_.bos));
  }
  if (!EncodeLines(item.text.data(), item.text.data() + item.text.size(), !item.document_start, out)) return;
  if (item.document_end && special_.eos >= 0) out->ids.push_back(static_cast<uint32_t>(special_.eos));
}

}  // namespace diloco::tokenize
