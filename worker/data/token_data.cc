#include "worker/data/token_data.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/data/token_manifest.h"
#include "worker/data/window_sampler.h"

namespace diloco {

absl::StatusOr<TokenData> TokenData::Load(const std::string& manifest_path, TokenSplit split, int64_t seq_len) {
  TokenManifest manifest;
  std::string error;
  if (!ReadTokenManifest(manifest_path, &manifest, &error)) return absl::DataLossError(error);
  const std::vector<TokenSegment>& segments = split == TokenSplit::kTrain ? manifest.train : manifest.val;
  auto tokens = MappedTokens::Open(segments);
  if (!tokens.ok()) return tokens.status();
  if (tokens->size() < seq_len + 2) {
    const char* name = split == TokenSplit::kTrain ? "training" : "validation";
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", name, " split of ", manifest_path, " (", segments.front().path, segments.size() > 1 ? ", ..." : "",
        "): ", tokens->size(), " tokens, fewer than one window of model.seq_len + 1 = ", seq_len + 1, " plus one"));
  }
  TokenData data;
  data.tokens_ = std::move(*tokens);
  data.layout_ = WholeSplitLayout(data.size(), seq_len);
  return data;
}

absl::Status TokenData::SelectShard(int64_t index, int64_t count, bool contiguous) {
  auto layout = MakeShardLayout(size(), seq_len(), index, count, contiguous);
  if (!layout.ok()) return layout.status();
  layout_ = *layout;
  return absl::OkStatus();
}

absl::Status TokenData::SelectRankShard(int64_t index, int64_t count, int64_t rank, int64_t ranks, bool contiguous) {
  auto layout = MakeRankLayout(size(), seq_len(), index, count, rank, ranks, contiguous);
  if (!layout.ok()) return layout.status();
  layout_ = *layout;
  return absl::OkStatus();
}

Batch TokenData::Sample(int64_t batch_size, std::mt19937_64& rng) const {
  std::vector<int64_t> starts;
  starts.reserve(batch_size);
  for (int64_t i = 0; i < batch_size; ++i) starts.push_back(DrawRandomStart(layout_, rng));
  return Gather(starts);
}

Batch TokenData::EvalBatch(int64_t i, int64_t n, int64_t batch_size) const {
  const int64_t total = n * batch_size;
  const int64_t span = size() - seq_len() - 1;
  std::vector<int64_t> starts;
  for (int64_t j = 0; j < batch_size; ++j) starts.push_back(span * (i * batch_size + j) / std::max<int64_t>(1, total));
  return Gather(starts);
}

Batch TokenData::Gather(const std::vector<int64_t>& starts) const {
  const int64_t t = seq_len();
  const int64_t b = static_cast<int64_t>(starts.size());
  Batch batch{torch::empty({b, t}, torch::kLong), torch::empty({b, t}, torch::kLong)};
  int64_t* inputs = batch.inputs.data_ptr<int64_t>();
  int64_t* targets = batch.targets.data_ptr<int64_t>();
  std::vector<int64_t> window(static_cast<size_t>(t + 1));
  for (int64_t row = 0; row < b; ++row) {
    tokens_.Copy(starts[row], t + 1, window.data());
    std::memcpy(inputs + row * t, window.data(), t * sizeof(int64_t));
    std::memcpy(targets + row * t, window.data() + 1, t * sizeof(int64_t));
  }
  return batch;
}

}  // namespace diloco
