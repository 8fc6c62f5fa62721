// TokenizeError: a fatal error of diloco-tokenize (a bad flag, an input it cannot read, an output it cannot write). Its
// steps throw it and main() catches it at one boundary, which prints "diloco-tokenize: error: <what>" (one line on
// stderr) and exits with exit_code(). Not absl::Status: this process links no abseil (Debian's SentencePiece cannot
// share a process with protobuf; docs/development.md, "Platform hazards"). The helpers of this folder return "" for OK
// or the error text; ThrowIfError turns such a text into the exception. Immutable; thread-safe.
#pragma once

#include <stdexcept>
#include <string>

namespace diloco::tokenize {

class TokenizeError : public std::runtime_error {
 public:
  explicit TokenizeError(const std::string& what, int exit_code = 1)
      : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Throws TokenizeError(error) unless error is "".
inline void ThrowIfError(const std::string& error) {
  if (!error.empty()) throw TokenizeError(error);
}

}  // namespace diloco::tokenize
