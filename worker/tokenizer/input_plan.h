// The plan of a tokenizer run: which byte ranges of which input files make up the training and the validation split.
//
// text: the validation split is the tail val_fraction of the bytes of the inputs' concatenation, cut after the next
// '\n' (for one file exactly the split diloco-tokenize has always made). jsonl: the validation split is the last
// val_fraction of the lines (records), found by a first pass that only counts '\n'. With --val-input files the whole
// inputs train and the val files validate. A range is a byte span of one file; for text a range is one document (a
// file, or the part of a file on one side of the cut). Plain functions over plain data; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace diloco::tokenize {

enum class InputFormat { kText, kJsonl, kTokens };

struct InputRange {
  std::string path;
  uint64_t begin = 0, end = 0;  // bytes [begin, end) of the file
  uint64_t first_line = 1;      // 1-based line number of the line starting at `begin` (jsonl error messages)
};

struct SplitPlan {
  std::vector<InputRange> train, val;
  uint64_t Bytes() const;  // of both splits
};

// Plans the split; an error message (naming the file or option) on failure, e.g. an unreadable input or a
// val_fraction that leaves one split empty.
std::string PlanSplit(InputFormat format, const std::vector<std::string>& inputs,
                      const std::vector<std::string>& val_inputs, double val_fraction, SplitPlan* plan);

// Size of a file in bytes; an error message naming it when it cannot be read.
std::string FileSize(const std::string& path, uint64_t* size);

}  // namespace diloco::tokenize
