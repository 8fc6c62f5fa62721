// Sparse pulls (proto/PROTOCOL.md "Sparse pulls", CODEC_UPDATE): a round whose outer step is theta_t = theta_{t-1} +
// (-lr) * delta, with delta the average of sparse (topk) pushes and no momentum, changes theta only where delta is
// not +0. A worker that holds theta_{t-1} bit for bit can then pull just the step s = fl(-lr * delta) at those
// positions and add it, theta_t = fl(theta_{t-1} + s): the same two roundings as the coordinator's step (its kernel is
// compiled without fused multiply-adds), so the result is bit-identical, for any lr. ThetaHash lets the worker check.
// A CODEC_UPDATE chunk covers elements [offset, offset + count) of one float32 tensor, cut into blocks of topk_chunk
// elements from the chunk's first element (offset is a multiple of it; the tensor's last block may be shorter), each
// coded on its own, byte-aligned (proto/update_block.h: the changed positions as Rice-coded gaps, each step as a sign
// and an index into the block's distinct magnitudes, those sent as trimmed literals or as sums of two or three).
// Pure functions and one single-stream applier; thread-compatible.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/diloco.pb.h"
#include "proto/named_tensors.h"
#include "proto/tensor_chunks.h"
#include "proto/tensor_spec.h"

namespace diloco {

// XXH64 (seed 0) of the tensors' float32 bytes, in order, as the coordinator's theta_t (PullHeader.theta_hash).
uint64_t ThetaHash(const NamedTensors& tensors);
uint64_t ThetaHash(const std::vector<at::Tensor>& tensors);

// Encodes the steps fl(minus_lr * delta[j]) at every j in [0, count) whose delta is not +0 into chunk->data, with
// codec CODEC_UPDATE and topk_chunk = block; other fields are left alone. Returns the changed positions' count.
int64_t EncodeUpdate(const float* delta, int64_t count, float minus_lr, int64_t block, TensorChunk* chunk);

// Checks and decodes a CODEC_UPDATE chunk: the changed positions (relative to the chunk's first element, ascending)
// and their steps. InvalidArgument naming the tensor and block for a block length out of [2, 65536], an offset that
// is not a multiple of it, a truncated or overlong payload, u above the block, counts of magnitudes out of range, a
// non-finite literal or sum, a sum naming a missing literal, a position out of its block, an index out of the table.
absl::StatusOr<SparseChunk> DecodeUpdate(const TensorChunk& chunk);

// Applies a sparse pull's CODEC_UPDATE chunks to `theta` (contiguous float32 CPU tensors holding theta_{t-1}):
// theta[pos] = theta[pos] + step, each chunk checked as the next of the stream (ChunkStreamReader). Done() once every
// element was covered. One per stream; not thread-safe.
class UpdateApplier {
 public:
  explicit UpdateApplier(NamedTensors theta);
  absl::Status Accept(const TensorChunk& chunk);
  bool Done() const { return reader_.Done(); }
  int64_t changed() const { return changed_; }
  const NamedTensors& theta() const { return theta_; }

 private:
  NamedTensors theta_;
  ChunkStreamReader reader_;
  int64_t changed_ = 0;
};

}  // namespace diloco
