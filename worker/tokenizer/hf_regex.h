// HfRegex: a pre-tokenizer pattern of tokenizer.json (the GPT-2, Llama 3 and Qwen2 regexes with \p{L}, \p{N},
// lookahead and case-insensitive groups) compiled by PCRE2 with UTF, UCP (Unicode \w, \d; \s as Oniguruma reads it) and
// its JIT. PCRE2 rather than a hand-written scanner: it runs any Split regex a tokenizer.json ships, with the Oniguruma
// syntax these patterns use, and its JIT matches at the speed of a dedicated scanner. Invalid UTF-8 never matches
// inside a character class (PCRE2_MATCH_INVALID_UTF). The compiled pattern is immutable and shared; each thread matches
// with its own match data and JIT stack (thread_local), so FindAll is thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace diloco::tokenize {

class HfRegex {
 public:
  // Compiles a pattern as the tokenizers library reads it (\s is Unicode White_Space); "" on success, else the error
  // (with the pattern).
  std::string Compile(const std::string& tokenizers_pattern);
  // Calls on_match(begin, end) for every non-overlapping match of subject, left to right; an empty match (begin ==
  // end) too, as a split point: after one the search goes on one character later (as Oniguruma's find_iter).
  void FindAll(std::string_view subject, const std::function<void(size_t, size_t)>& on_match) const;

 private:
  std::shared_ptr<void> code_;  // pcre2_code_8, freed with pcre2_code_free_8
};

}  // namespace diloco::tokenize
