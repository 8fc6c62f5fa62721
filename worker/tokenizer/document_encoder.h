// DocumentEncoder: turns one work item into token ids with a loaded tokenizer (text_tokenizer.h: SentencePiece or
// tokenizer.json). A document is written as [BOS] ids... [EOS] (each only when the tokenizer has that id); with a
// SentencePiece model diloco-tokenize trained its lines are encoded one by one and every '\n' becomes our "<nl>"
// symbol; with any other SentencePiece model or a tokenizer.json the text is encoded whole:
// a text document cut into work items (work_items.h cuts after a single '\n' between visible characters, a word
// boundary of every pre-tokenizer we read) is encoded item by item, each later item as a continuation (nothing
// prepended), which gives the ids of one encode() of the whole file. Not so when a cut falls just before an added
// token with lstrip (it would have taken in the line end before it), at the fallback cut of a text with no single
// line break for kCutSearchBlocks blocks, or with a model without a pre-tokenizer whose merges join a line end to
// the next line (Llama 2 / Mistral have none: they encode '\n' as the byte <0x0A>).
// text: a document is a whole range (a file or its part on one side of the train/validation cut), so BOS goes in
// front of the item that starts it and EOS after the item that ends it. jsonl: each line is one JSON object whose
// string field `jsonl_field` is a document; a bad line is an error "FILE:LINE: ..." or, when skipping, counted.
// Encode() is const and thread-safe (TextTokenizer::Encode is), so one encoder serves every thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/tokenizer/input_plan.h"
#include "worker/tokenizer/text_tokenizer.h"
#include "worker/tokenizer/work_items.h"

namespace diloco::tokenize {

struct EncodedItem {
  uint64_t seq = 0;
  std::vector<uint32_t> ids;
  uint64_t documents = 0;    // documents that start in this item
  uint64_t bad_records = 0;  // jsonl lines skipped
  uint64_t bytes = 0;        // of input text
  std::string error;         // the item failed (a bad jsonl line under on_bad_record fail, an encoding error)
  SplitPosition next;
};

class DocumentEncoder {
 public:
  DocumentEncoder(const TextTokenizer& tokenizer, InputFormat format, std::string jsonl_field, bool skip_bad_records);

  void Encode(const WorkItem& item, const std::string& path, EncodedItem* out) const;

 private:
  // Appends the ids of text (continues: a later part of a document, TextTokenizer::EncodeContinuation). False and
  // out->error on failure.
  bool EncodeLines(const char* begin, const char* end, bool continues, EncodedItem* out) const;
  void EncodeJsonl(const WorkItem& item, const std::string& path, EncodedItem* out) const;

  const TextTokenizer& tokenizer_;
  const SpecialIds special_;
  const InputFormat format_;
  const std::string jsonl_field_;
  const bool skip_bad_records_;
};

}  // namespace diloco::tokenize
