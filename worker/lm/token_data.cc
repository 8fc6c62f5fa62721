#include "worker/lm/token_data.h"

#include "absl/strings/str_cat.h"
#include "worker/lm/token_shard.h"

namespace diloco {

std::vector<TokenRange> ShardRanges(int64_t num_tokens, int64_t index, int64_t count, int64_t block_tokens) {
  std::vector<TokenRange> ranges;
  const int64_t num_blocks = (num_tokens + block_tokens - 1) / block_tokens;
  for (int64_t b = index; b < num_blocks; b += count) {
    ranges.push_back({b * block_tokens, std::min(num_tokens, (b + 1) * block_tokens)});
  }
  return ranges;
}

absl::StatusOr<TokenData> TokenData::Load(const std::string& path, int64_t seq_len) {
  std::vector<int32_t> ids;
  std::string error;
  if (!ReadTokenShard(path, &ids, &error)) return absl::DataLossError(error);
  if (static_cast<int64_t>(ids.size()) < seq_len + 2) {
    return absl::FailedPreconditionError(absl::StrCat(
        "token shard ", path, ": ", ids.size(), " tokens, fewer than one window of model.seq_len + 1 = ", seq_len + 1));
  }
  TokenData data;
  data.tokens_ = torch::from_blob(ids.data(), {static_cast<int64_t>(ids.size())}, torch::kInt).to(torch::kLong);
  data.seq_len_ = seq_len;
  data.ranges_ = {{0, data.size()}};
  data.range_windows_ = data.size() - seq_len;
  return data;
}

absl::Status TokenData::SelectShard(int64_t index, int64_t count, bool contiguous) {
  if (count <= 0 || index < 0 || index >= count) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", index, " of ", count, " does not exist"));
  }
  std::vector<TokenRange> usable;
  int64_t windows = 0;
  const int64_t block = contiguous ? (size() + count - 1) / count : std::max(kShardBlockTokens, 4 * (seq_len_ + 1));
  for (const TokenRange& r : ShardRanges(size(), index, count, block)) {
    if (r.end - r.begin > seq_len_) {
      usable.push_back(r);
      windows += r.end - r.begin - seq_len_;
    }
  }
  if (usable.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", index, " of ", count, " of ", size(),
                                                      " tokens holds no full window; use fewer workers"));
  }
  ranges_ = std::move(usable);
  range_windows_ = windows;
  return absl::OkStatus();
}

Batch TokenData::Sample(int64_t batch_size, std::mt19937_64& rng) const {
  std::uniform_int_distribution<int64_t> pick(0, range_windows_ - 1);
  std::vector<int64_t> starts;
  starts.reserve(batch_size);
  for (int64_t i = 0; i < batch_size; ++i) {
    int64_t w = pick(rng);
    for (const TokenRange& r : ranges_) {  // map the window number to a start inside one range
      const int64_t n = r.end - r.begin - seq_len_;
      if (w < n) {
        starts.push_back(r.begin + w);
        break;
      }
      w -= n;
    }
  }
  return Gather(starts);
}

Batch TokenData::EvalBatch(int64_t i, int64_t n, int64_t batch_size) const {
  const int64_t total = n * batch_size;
  const int64_t span = size() - seq_len_ - 1;
  std::vector<int64_t> starts;
  for (int64_t j = 0; j < batch_size; ++j) starts.push_back(span * (i * batch_size + j) / std::max<int64_t>(1, total));
  return Gather(starts);
}

Batch TokenData::Gather(const std::vector<int64_t>& starts) const {
  auto offsets = torch::arange(seq_len_ + 1, torch::kLong);
  auto begin = torch::tensor(starts, torch::kLong).unsqueeze(1);
  auto windows = tokens_.index_select(0, (begin + offsets).reshape({-1})).view({-1, seq_len_ + 1});
  return {windows.narrow(1, 0, seq_len_).contiguous(), windows.narrow(1, 1, seq_len_).contiguous()};
}

}  // namespace diloco
