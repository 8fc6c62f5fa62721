// Work items: an input split cut into pieces of whole lines (about item_bytes each, default kWorkItemBytes) that
// encoder threads can encode independently. A cut falls after a single '\n' between two visible characters
// (CutFitsAt): a word boundary for every pre-tokenizer we read, so the items' ids are those of the whole file
// (document_encoder.h). Not after a run of white space: GPT-2's \s+(?!\S) splits "a\n\nb" as a, \n, \n, b but an
// item ending "a\n\n" as a, \n\n (and "a \n", "a\r\n" alike), while Llama 3's \s*[\r\n]+ and its
// punctuation-with-newlines word would break before such a run. The cut is the last such place within item_bytes,
// else the first one after, within kCutSearchBlocks x item_bytes; else the last '\n' read by then (a text with no
// single line break there: ids may differ at that cut), or in the first block after that holds one, else the range's
// end. It is a function of the start offset only, so a run resumed at an item boundary cuts the rest exactly as an
// uninterrupted run does. ItemReader is used by one thread (the pipeline's reader); items are plain data.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "worker/tokenizer/input_plan.h"

namespace diloco::tokenize {

constexpr uint64_t kWorkItemBytes = 1 << 20;
constexpr uint64_t kCutSearchBlocks = 4;
// Recorded in a run's resume arguments: a run cut by another rule is not resumed (its items would mix the rules).
constexpr int kCutRuleVersion = 2;

// Whether an item may start at text[at]: text[at - 1] is a '\n' and the characters before it and at `at` are whole in
// text and visible (neither white space nor a control or zero-width character).
bool CutFitsAt(std::string_view text, size_t at);

// Where a split's stream stands: the next byte to read (range index, offset in that range's file, its line number).
struct SplitPosition {
  size_t range = 0;
  uint64_t offset = 0;
  uint64_t line = 1;
};

struct WorkItem {
  uint64_t seq = 0;  // order in the stream (0, 1, ...)
  size_t range = 0;  // index into the split's ranges
  uint64_t begin = 0, end = 0;
  uint64_t first_line = 1;                            // 1-based line number of the item's first line
  bool document_start = false, document_end = false;  // text: the item begins / ends its range (a document)
  std::string text;
  SplitPosition next;  // the position after this item (where a resumed run continues)
};

// Reads a split's ranges from a position, one item at a time. Not thread-safe.
class ItemReader {
 public:
  ItemReader(const std::vector<InputRange>& ranges, SplitPosition start, uint64_t item_bytes = kWorkItemBytes);
  ~ItemReader();
  ItemReader(const ItemReader&) = delete;
  ItemReader& operator=(const ItemReader&) = delete;

  // The next item: true and *item set; false at the end of the split or on error (then error() is non-empty).
  bool Next(WorkItem* item);
  const std::string& error() const { return error_; }

 private:
  bool OpenRange();

  const std::vector<InputRange>& ranges_;
  SplitPosition at_;
  const uint64_t item_bytes_;
  int fd_ = -1;
  uint64_t seq_ = 0;
  std::string error_;
};

}  // namespace diloco::tokenize
