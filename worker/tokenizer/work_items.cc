#include "worker/tokenizer/work_items.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "worker/tokenizer/hf_text.h"

namespace diloco::tokenize {
namespace {

// The last place in text where an item may start, or npos.
size_t LastFittingCut(std::string_view text) {
  for (size_t nl = text.rfind('\n'); nl != std::string::npos; nl = text.rfind('\n', nl - 1)) {
    if (CutFitsAt(text, nl + 1)) return nl + 1;
    if (nl == 0) break;
  }
  return std::string::npos;
}

// The first place where an item may start whose '\n' is at or after `from` - 4 (a character after it may have been
// cut by the end of the block read before), or npos.
size_t FirstFittingCut(std::string_view text, size_t from) {
  for (size_t nl = text.find('\n', from > 4 ? from - 4 : 0); nl != std::string::npos; nl = text.find('\n', nl + 1)) {
    if (CutFitsAt(text, nl + 1)) return nl + 1;
  }
  return std::string::npos;
}

// Whether the whole character of text at `at` is neither white space nor a control or zero-width character.
bool VisibleAt(std::string_view text, size_t at) {
  const unsigned char c = static_cast<unsigned char>(text[at]);
  if (c < 0x80) return c > 0x20 && c != 0x7F;
  const size_t n = Utf8Length(c);
  if (n == 1 || at + n > text.size() || !IsValidUtf8(text.substr(at, n))) return false;
  size_t length = 0;
  const uint32_t cp = CodePointAt(text, at, &length);
  const bool zero_width = cp == 0x180E || (cp >= 0x200B && cp <= 0x200D) || cp == 0x2060 || cp == 0xFEFF;
  return cp >= 0xA0 && !IsWhiteSpace(cp) && !zero_width;
}

}  // namespace

bool CutFitsAt(std::string_view text, size_t at) {
  if (at < 2 || at >= text.size() || text[at - 1] != '\n') return false;
  size_t before = at - 2;  // the start of the character before the '\n'
  while (before > 0 && at - 2 - before < 3 && (static_cast<unsigned char>(text[before]) & 0xC0) == 0x80) --before;
  return VisibleAt(text, before) && before + Utf8Length(static_cast<unsigned char>(text[before])) == at - 1 &&
         VisibleAt(text, at);
}

ItemReader::ItemReader(const std::vector<InputRange>& ranges, SplitPosition start, uint64_t item_bytes)
    : ranges_(ranges), at_(start), item_bytes_(item_bytes) {}

ItemReader::~ItemReader() {
  if (fd_ >= 0) close(fd_);
}

bool ItemReader::OpenRange() {
  if (fd_ >= 0) close(fd_);
  fd_ = open(ranges_[at_.range].path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) error_ = ranges_[at_.range].path + ": cannot read (" + std::strerror(errno) + ")";
  return fd_ >= 0;
}

bool ItemReader::Next(WorkItem* item) {
  if (at_.range >= ranges_.size()) return false;
  const InputRange& range = ranges_[at_.range];
  if (fd_ < 0 && !OpenRange()) return false;
  item->seq = seq_++;
  item->range = at_.range;
  item->begin = at_.offset;
  item->first_line = at_.line;
  item->document_start = at_.offset == range.begin;
  std::string& text = item->text;
  text.clear();
  size_t cut = std::string::npos;
  while (cut == std::string::npos) {
    const uint64_t from = at_.offset + text.size();
    if (from >= range.end) {
      cut = text.size();
      break;
    }
    const size_t want = static_cast<size_t>(std::min<uint64_t>(item_bytes_, range.end - from));
    const size_t old = text.size();
    text.resize(old + want);
    const ssize_t n = pread(fd_, text.data() + old, want, static_cast<off_t>(from));
    if (n != static_cast<ssize_t>(want)) {
      error_ = range.path + ": read failed at byte " + std::to_string(from) +
               (n < 0 ? std::string(" (") + std::strerror(errno) + ")" : " (the file shrank while tokenizing)");
      return false;
    }
    if (from + want >= range.end) {
      cut = text.size();
      break;
    }
    // The last fitting place of the first block, else the first one after (CutFitsAt; the header says why).
    cut = old == 0 ? LastFittingCut(text) : FirstFittingCut(text, old);
    if (cut == std::string::npos && text.size() >= kCutSearchBlocks * item_bytes_) {
      // None within kCutSearchBlocks blocks (every line starts with white space): the last line end read will do.
      if (const size_t nl = text.rfind('\n'); nl != std::string::npos) cut = nl + 1;
    }
  }
  text.resize(cut);
  item->end = at_.offset + cut;
  item->document_end = item->end == range.end;
  const uint64_t lines = static_cast<uint64_t>(std::count(text.begin(), text.end(), '\n'));
  at_.offset = item->end;
  at_.line += lines;
  if (item->document_end) {
    close(fd_);
    fd_ = -1;
    if (++at_.range < ranges_.size()) {
      at_.offset = ranges_[at_.range].begin;
      at_.line = ranges_[at_.range].first_line;
    }
  }
  item->next = at_;
  return true;
}

}  // namespace diloco::tokenize
