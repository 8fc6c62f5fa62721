#define PCRE2_CODE_UNIT_WIDTH 8
#include "worker/tokenizer/hf_regex.h"

#include <pcre2.h>

namespace diloco::tokenize {
namespace {

// One thread's matching state: match data for one pair of offsets and a JIT stack big enough for long runs of
// whitespace (\s+(?!\S) backtracks over the run).
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 << 10, 8 << 20, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadMatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

// `pattern` with \s and \S as Oniguruma reads them (the tokenizers library's engine): Unicode White_Space. PCRE2's
// \s also takes U+180E (Mongolian vowel separator, a format character since Unicode 6.3). Other escapes, and quoted
// text (\Q...\E, a Split's String pattern), are kept.
std::string OnigurumaSpaces(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size());
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char next = pattern[++i];
    if (next == 'Q') {
      const size_t end = pattern.find("\\E", i + 1);
      const size_t stop = end == std::string::npos ? pattern.size() : end + 2;
      out.append(pattern, i - 1, stop - (i - 1));
      i = stop - 1;
    } else if (next == 's') {
      out += "\\p{White_Space}";
    } else if (next == 'S') {
      out += "\\P{White_Space}";
    } else {
      out += '\\';
      out += next;
    }
  }
  return out;
}

}  // namespace

std::string HfRegex::Compile(const std::string& tokenizers_pattern) {
  const std::string pattern = OnigurumaSpaces(tokenizers_pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return "the pre-tokenizer regex '" + tokenizers_pattern + "' does not compile (PCRE2 at offset " +
           std::to_string(offset) + ": " + reinterpret_cast<const char*>(message) + ")";
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without a JIT (some platforms) pcre2_match interprets
  code_ = std::shared_ptr<void>(code, [](void* c) { pcre2_code_free(static_cast<pcre2_code*>(c)); });
  return "";
}

void HfRegex::FindAll(std::string_view subject, const std::function<void(size_t, size_t)>& on_match) const {
  thread_local ThreadMatchState state;
  const auto* code = static_cast<const pcre2_code*>(code_.get());
  const auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  for (size_t at = 0; at < subject.size();) {
    const int rc = pcre2_match(code, text, subject.size(), at, 0, state.data, state.context);
    if (rc < 0) return;  // no further match (or a matching error: the rest stays one gap)
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    const size_t begin = ovector[0], end = ovector[1];
    on_match(begin, end);  // an empty match too: the tokenizers library splits there
    at = end > at ? end : at + 1;
    while (at < subject.size() && (static_cast<unsigned char>(subject[at]) & 0xC0) == 0x80) ++at;
  }
}

}  // namespace diloco::tokenize
