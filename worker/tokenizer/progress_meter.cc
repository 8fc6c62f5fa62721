#include "worker/tokenizer/progress_meter.h"

#include <unistd.h>

#include <cstdio>

namespace diloco::tokenize {

ProgressMeter::ProgressMeter(uint64_t total_bytes, uint64_t done_bytes)
    : terminal_(isatty(STDERR_FILENO) == 1),
      total_bytes_(total_bytes),
      start_bytes_(done_bytes),
      bytes_(done_bytes),
      start_(Clock::now()),
      last_print_(start_) {}

void ProgressMeter::Add(uint64_t bytes, uint64_t tokens, uint64_t documents) {
  bytes_ += bytes;
  tokens_ += tokens;
  documents_ += documents;
  const auto now = Clock::now();
  const auto interval = terminal_ ? std::chrono::milliseconds(200) : std::chrono::milliseconds(5000);
  if (now - last_print_ >= interval) {
    last_print_ = now;
    Print(false);
  }
}

void ProgressMeter::Finish() {
  if (terminal_ && printed_) Print(true);
}

void ProgressMeter::Print(bool final_line) {
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  const double mb = 1e-6 * static_cast<double>(bytes_);
  const double rate = seconds > 0 ? 1e-6 * static_cast<double>(bytes_ - start_bytes_) / seconds : 0;
  const double left_mb = 1e-6 * static_cast<double>(total_bytes_ > bytes_ ? total_bytes_ - bytes_ : 0);
  char eta[32] = "?";
  if (rate > 0) {
    const long s = static_cast<long>(left_mb / rate);
    snprintf(eta, sizeof(eta), "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  }
  fprintf(stderr, "%sdiloco-tokenize progress: %llu documents, %llu tokens, %.1f / %.1f MB, %.1f MB/s, ETA %s%s",
          terminal_ ? "\r" : "", static_cast<unsigned long long>(documents_), static_cast<unsigned long long>(tokens_),
          mb, 1e-6 * static_cast<double>(total_bytes_), rate, eta, terminal_ && !final_line ? "\033[K" : "\n");
  fflush(stderr);
  printed_ = true;
}

}  // namespace diloco::tokenize
