// Tensor <-> chunk stream: how named tensors travel over gRPC (DESIGN.md §2).
//
// TensorChunker turns an ordered list of named tensors into TensorChunk messages of at most `chunk_bytes` payload,
// lazily, one at a time (so a stream never holds more than one chunk). ChunkStreamReader checks an incoming stream
// against the expected specs (same order, same names, dtypes and shapes, consecutive offsets, exact byte counts)
// and hands back each chunk's payload as a 1-D tensor view, without copying. Neither is thread-safe: one per stream.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/diloco.pb.h"
#include "proto/tensor_spec.h"

namespace diloco {

constexpr int64_t kDefaultChunkBytes = 1 << 20;

class TensorChunker {
 public:
  // Tensors must be on the CPU; non-contiguous ones are made contiguous once, here.
  TensorChunker(std::vector<std::pair<std::string, at::Tensor>> tensors, int64_t chunk_bytes);

  // Fills `out` with the next chunk; returns false when every tensor has been sent.
  bool Next(TensorChunk* out);

  int64_t bytes_emitted() const { return bytes_emitted_; }

 private:
  std::vector<std::pair<std::string, at::Tensor>> tensors_;
  int64_t chunk_bytes_;
  size_t index_ = 0;
  int64_t offset_ = 0;  // in elements, within tensors_[index_]
  int64_t bytes_emitted_ = 0;
};

class ChunkStreamReader {
 public:
  explicit ChunkStreamReader(std::vector<TensorSpec> specs);

  // Validates `chunk` as the next one of the stream. On success returns a 1-D view (count elements, the chunk's
  // dtype) of chunk.data(); the view is valid only while `chunk` is alive and unchanged.
  absl::StatusOr<at::Tensor> Next(const TensorChunk& chunk);

  // Index into specs of the tensor the last accepted chunk belonged to, and that chunk's element offset.
  size_t tensor_index() const { return last_index_; }
  int64_t chunk_offset() const { return last_offset_; }

  // True once every element of every tensor has arrived.
  bool Done() const { return index_ == specs_.size(); }

  // Where the stream stands, for error messages ("tensor 3/10 'blocks.0.attn.qkv.weight' at element 4096").
  std::string Position() const;

 private:
  std::vector<TensorSpec> specs_;
  size_t index_ = 0;
  int64_t offset_ = 0;
  size_t last_index_ = 0;
  int64_t last_offset_ = 0;
};

// Copies every chunk of a stream into preallocated tensors (used by the pull on the worker side).
class ChunkAssembler {
 public:
  // `dest` tensors must be contiguous CPU tensors whose specs the stream must match.
  explicit ChunkAssembler(std::vector<std::pair<std::string, at::Tensor>> dest);
  absl::Status Accept(const TensorChunk& chunk);
  bool Done() const { return reader_.Done(); }

 private:
  std::vector<std::pair<std::string, at::Tensor>> dest_;
  ChunkStreamReader reader_;
};

}  // namespace diloco
