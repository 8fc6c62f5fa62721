// ShardOutput: the tokenizer's output directory while it is being built, and its resume protocol.
//
// Everything is written into the fixed-name directory <out>.partial: tokenizer.model, then the token stream of each
// split cut into shards (train-00000.tok, ..., val-00000.tok; format worker/data/token_shard.h) of about shard_tokens
// ids, cut only after a whole work item. After the tokenizer is ready and after every finished shard, progress.json
// records atomically where the stream stands (split, input range, byte offset, line, the finished shards' counts,
// documents, bad records) together with the run's arguments. A rerun with the same arguments continues from that
// record (Open() says so and from where); a record made with other arguments is discarded with a line saying which
// argument differs. Finish() writes meta.json (worker/data/token_manifest.h) and renames <out>.partial to <out>, so the
// finished directory appears atomically. Used by one thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/data/token_manifest.h"
#include "worker/data/token_shard.h"
#include "worker/tokenizer/document_encoder.h"
#include "worker/tokenizer/work_items.h"

namespace diloco::tokenize {

enum Split { kTrain = 0, kVal = 1, kDone = 2 };

struct ResumeRecord {
  nlohmann::json args;     // the run's arguments (inputs with size and mtime, format, vocab, ...), compared on resume
  int split = kTrain;      // the split being written
  SplitPosition position;  // where that split's stream continues
  std::vector<uint64_t> shards[2];  // ids in each finished shard, per split
  uint64_t documents = 0, bad_records = 0, bytes_done = 0;
};

class ShardOutput {
 public:
  // Opens <out_dir>.partial, resuming from its record when the arguments match (*resumed = true), else emptying it.
  std::string Open(const std::string& out_dir, const nlohmann::json& args, uint64_t vocab_size, uint64_t shard_tokens,
                   bool* resumed);

  const std::string& partial_dir() const { return partial_; }
  const ResumeRecord& record() const { return record_; }
  int shards_finished_here() const { return shards_finished_here_; }

  // Writes the record as it stands (after the tokenizer is ready).
  std::string Save();
  // Appends an item of `split`; finishes the shard (and saves the record) once it holds shard_tokens ids.
  std::string Add(int split, const EncodedItem& item);
  // Ends `split`: finishes its open shard and moves the record to the next split.
  std::string EndSplit(int split, const SplitPosition& next_split_start);
  // Writes meta.json from `manifest` plus the shards and renames the directory to out_dir.
  std::string Finish(TokenManifest manifest);

 private:
  std::string ShardPath(int split, size_t index) const;
  std::string FinishShard(int split, const SplitPosition& next);

  std::string out_, partial_;
  uint64_t vocab_size_ = 0, shard_tokens_ = 0;
  ResumeRecord record_;
  TokenShardWriter writer_;
  uint64_t pending_documents_ = 0, pending_bad_ = 0, pending_bytes_ = 0;  // in the open shard, not yet recorded
  int shards_finished_here_ = 0;
};

}  // namespace diloco::tokenize
