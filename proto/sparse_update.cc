// CODEC_UPDATE, the sparse pull's format (proto/sparse_update.h): encode, decode with every check, apply, hash.
#include "proto/sparse_update.h"

#include <xxhash.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "proto/peer_text.h"
#include "proto/topk_codec.h"
#include "proto/update_block.h"

namespace diloco {
namespace {

absl::Status Refuse(const TensorChunk& chunk, int64_t block, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor '", Truncated(chunk.name()), "': update chunk at element ",
                                                 chunk.offset(), ", block ", block, ": ", what));
}

}  // namespace

uint64_t ThetaHash(const std::vector<at::Tensor>& tensors) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  for (const at::Tensor& t : tensors) {
    const at::Tensor c = t.contiguous();
    XXH64_update(state, c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
  const uint64_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return h;
}

uint64_t ThetaHash(const NamedTensors& tensors) {
  std::vector<at::Tensor> plain;
  for (const auto& [name, t] : tensors) plain.push_back(t);
  return ThetaHash(plain);
}

int64_t EncodeUpdate(const float* delta, int64_t count, float minus_lr, int64_t block, TensorChunk* chunk) {
  std::string data;
  int64_t changed = 0;
  for (int64_t start = 0; start < count; start += block) {
    EncodeUpdateBlock(delta + start, std::min(block, count - start), minus_lr, &data, &changed);
  }
  chunk->set_codec(CODEC_UPDATE);
  chunk->set_topk_chunk(block);
  chunk->set_data(std::move(data));
  return changed;
}

absl::StatusOr<SparseChunk> DecodeUpdate(const TensorChunk& chunk) {
  const int64_t block = chunk.topk_chunk();
  if (block < 2 || block > kMaxTopkChunk) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", Truncated(chunk.name()), "': update block length ",
                                                   block, " not in [2, ", kMaxTopkChunk, "]"));
  }
  if (chunk.offset() % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", Truncated(chunk.name()), "': update chunk at element ",
                                                   chunk.offset(), " does not start a block of ", block));
  }
  UpdateReader in(chunk.data());
  std::vector<int64_t> index;
  std::vector<float> values;
  for (int64_t start = 0, b = 0; start < chunk.count(); start += block, ++b) {
    const std::string bad = DecodeUpdateBlock(std::min(block, chunk.count() - start), start, in, &index, &values);
    if (!bad.empty()) return Refuse(chunk, b, bad);
  }
  if (!in.AtEnd()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", Truncated(chunk.name()), "': update chunk at element ",
                                                   chunk.offset(), " carries bytes after its last block"));
  }
  SparseChunk out;
  out.index = at::empty({static_cast<int64_t>(index.size())}, at::kLong);
  out.values = at::empty({static_cast<int64_t>(values.size())}, at::kFloat);
  std::copy(index.begin(), index.end(), out.index.data_ptr<int64_t>());
  std::copy(values.begin(), values.end(), out.values.data_ptr<float>());
  return out;
}

UpdateApplier::UpdateApplier(NamedTensors theta) : theta_(std::move(theta)), reader_(SpecsOf(theta_)) {}

absl::Status UpdateApplier::Accept(const TensorChunk& chunk) {
  if (chunk.codec() != CODEC_UPDATE) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", Truncated(chunk.name()), "': a sparse pull sends only CODEC_UPDATE chunks"));
  }
  auto sparse = reader_.NextSparse(chunk);
  if (!sparse.ok()) return sparse.status();
  float* p = theta_[reader_.tensor_index()].second.data_ptr<float>() + reader_.chunk_offset();
  const int64_t* index = sparse->index.data_ptr<int64_t>();
  const float* steps = sparse->values.data_ptr<float>();
  const int64_t n = sparse->index.numel();
  for (int64_t i = 0; i < n; ++i) p[index[i]] = p[index[i]] + steps[i];  // the coordinator's one rounding
  changed_ += n;
  return absl::OkStatus();
}

}  // namespace diloco
