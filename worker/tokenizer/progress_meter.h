// ProgressMeter: the tokenizer's progress on stderr: documents, tokens, MB read of the total, MB/s and ETA. On a
// terminal one line redrawn in place (\r) at most ~5 times a second; otherwise (a log file, a parent capturing it) a
// plain line every ~5 seconds. Lines start with "diloco-tokenize progress" so they never read as the final summary.
// Used by one thread (the pipeline's consumer).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace diloco::tokenize {

class ProgressMeter {
 public:
  // total_bytes: of all input; done_bytes: already done before this process started (a resumed run).
  ProgressMeter(uint64_t total_bytes, uint64_t done_bytes);

  void Add(uint64_t bytes, uint64_t tokens, uint64_t documents);
  // Ends the redrawn line on a terminal (call before printing anything else).
  void Finish();

 private:
  void Print(bool final_line);

  using Clock = std::chrono::steady_clock;
  const bool terminal_;
  const uint64_t total_bytes_;
  const uint64_t start_bytes_;
  uint64_t bytes_, tokens_ = 0, documents_ = 0;
  Clock::time_point start_, last_print_;
  bool printed_ = false;
};

}  // namespace diloco::tokenize
