#include "worker/tokenizer/input_plan.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace diloco::tokenize {
namespace {

constexpr size_t kScanBytes = 1 << 20;

// A file opened for the first-pass scans; closes itself.
class ScanFile {
 public:
  explicit ScanFile(const std::string& path) : fd_(open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~ScanFile() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  ssize_t Read(char* buf, size_t n, uint64_t offset) const { return pread(fd_, buf, n, static_cast<off_t>(offset)); }

 private:
  int fd_;
};

std::string ReadError(const std::string& path) { return path + ": cannot read (" + std::strerror(errno) + ")"; }

// Offset just past the first '\n' at or after `from` in the file, or its size when there is none.
std::string LineEndAfter(const std::string& path, uint64_t from, uint64_t size, uint64_t* out) {
  ScanFile file(path);
  if (!file.ok()) return ReadError(path);
  std::vector<char> buf(kScanBytes);
  for (uint64_t at = from; at < size;) {
    const ssize_t n = file.Read(buf.data(), buf.size(), at);
    if (n <= 0) return ReadError(path);
    if (const void* nl = memchr(buf.data(), '\n', n)) {
      *out = at + (static_cast<const char*>(nl) - buf.data()) + 1;
      return "";
    }
    at += n;
  }
  *out = size;
  return "";
}

// Counts the lines of a file (a last line without '\n' counts too). With `stop_at_line` > 0, sets *offset to the byte
// offset where line `stop_at_line` (0-based) begins and stops there.
std::string CountLines(const std::string& path, uint64_t size, uint64_t stop_at_line, uint64_t* lines,
                       uint64_t* offset) {
  ScanFile file(path);
  if (!file.ok()) return ReadError(path);
  std::vector<char> buf(kScanBytes);
  *lines = 0;
  for (uint64_t at = 0; at < size;) {
    const ssize_t n = file.Read(buf.data(), buf.size(), at);
    if (n <= 0) return ReadError(path);
    for (const char* p = buf.data(); (p = static_cast<const char*>(memchr(p, '\n', buf.data() + n - p)));) {
      ++p;
      if (++*lines == stop_at_line && offset != nullptr) {
        *offset = at + (p - buf.data());
        return "";
      }
    }
    at += n;
    if (at == size && buf[n - 1] != '\n') ++*lines;
  }
  return "";
}

std::string WholeFiles(const std::vector<std::string>& paths, std::vector<InputRange>* out) {
  for (const std::string& path : paths) {
    uint64_t size = 0;
    if (std::string e = FileSize(path, &size); !e.empty()) return e;
    if (size > 0) out->push_back({path, 0, size, 1});
  }
  return "";
}

// text: cut the concatenation at (1 - val_fraction) of its bytes, then after the next '\n'.
std::string PlanText(const std::vector<InputRange>& all, double val_fraction, SplitPlan* plan) {
  uint64_t total = 0;
  for (const InputRange& r : all) total += r.end;
  uint64_t cut = static_cast<uint64_t>(static_cast<double>(total) * (1.0 - val_fraction));
  for (const InputRange& r : all) {
    if (cut >= r.end) {  // wholly before the cut
      plan->train.push_back(r);
      cut -= r.end;
      continue;
    }
    if (cut == UINT64_MAX) {  // wholly after the cut
      plan->val.push_back(r);
      continue;
    }
    uint64_t at = 0;
    if (std::string e = LineEndAfter(r.path, cut, r.end, &at); !e.empty()) return e;
    if (at > 0) plan->train.push_back({r.path, 0, at, 1});
    if (at < r.end) plan->val.push_back({r.path, at, r.end, 1});
    cut = UINT64_MAX;
  }
  return "";
}

// jsonl: the last val_fraction of the lines validate.
std::string PlanJsonl(const std::vector<InputRange>& all, double val_fraction, SplitPlan* plan) {
  std::vector<uint64_t> lines(all.size());
  uint64_t total = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (std::string e = CountLines(all[i].path, all[i].end, 0, &lines[i], nullptr); !e.empty()) return e;
    total += lines[i];
  }
  uint64_t train_lines = static_cast<uint64_t>(static_cast<double>(total) * (1.0 - val_fraction));
  for (size_t i = 0; i < all.size(); ++i) {
    if (train_lines >= lines[i]) {
      plan->train.push_back(all[i]);
      train_lines -= lines[i];
    } else if (train_lines == 0) {
      plan->val.push_back(all[i]);
    } else {
      uint64_t counted = 0, at = 0;
      if (std::string e = CountLines(all[i].path, all[i].end, train_lines, &counted, &at); !e.empty()) return e;
      plan->train.push_back({all[i].path, 0, at, 1});
      plan->val.push_back({all[i].path, at, all[i].end, train_lines + 1});
      train_lines = 0;
    }
  }
  return "";
}

}  // namespace

uint64_t SplitPlan::Bytes() const {
  uint64_t n = 0;
  for (const auto* split : {&train, &val}) {
    for (const InputRange& r : *split) n += r.end - r.begin;
  }
  return n;
}

std::string FileSize(const std::string& path, uint64_t* size) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ReadError(path);
  if (!S_ISREG(st.st_mode)) return path + ": not a regular file";
  *size = static_cast<uint64_t>(st.st_size);
  return "";
}

std::string PlanSplit(InputFormat format, const std::vector<std::string>& inputs,
                      const std::vector<std::string>& val_inputs, double val_fraction, SplitPlan* plan) {
  *plan = SplitPlan{};
  if (inputs.empty()) return "no input files (--input, --input-list or --text)";
  std::vector<InputRange> all;
  if (std::string e = WholeFiles(inputs, &all); !e.empty()) return e;
  if (!val_inputs.empty()) {
    plan->train = all;
    if (std::string e = WholeFiles(val_inputs, &plan->val); !e.empty()) return e;
  } else {
    if (!(val_fraction > 0 && val_fraction < 1)) return "--val-fraction must be in (0, 1) when there are no val files";
    const std::string e =
        format == InputFormat::kJsonl ? PlanJsonl(all, val_fraction, plan) : PlanText(all, val_fraction, plan);
    if (!e.empty()) return e;
  }
  if (plan->train.empty()) return "the inputs leave no training data (all files empty?)";
  if (plan->val.empty()) {
    return val_inputs.empty() ? "--val-fraction " + std::to_string(val_fraction) + " leaves no validation text"
                              : "the val files are empty";
  }
  return "";
}

}  // namespace diloco::tokenize
