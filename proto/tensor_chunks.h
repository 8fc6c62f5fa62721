// Tensor <-> chunk stream: how named tensors travel over gRPC (docs/development.md, "Architecture").
//
// TensorChunker turns an ordered list of named tensors into TensorChunk messages of about `chunk_bytes` encoded
// payload, lazily, one at a time (so a stream never holds more than one chunk), float32 tensors encoded with the
// given codec (proto/codec.h), others raw. ChunkStreamReader checks an incoming stream against the expected specs
// (same order, same names, dtypes and shapes, consecutive offsets, exact byte counts for the chunk's codec) and hands
// back each chunk's values as a 1-D tensor (a view without copying for raw chunks, decoded float32 otherwise).
// A chunk out of order or repeated is refused. Neither is thread-safe: one per stream.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/codec.h"
#include "proto/diloco.pb.h"
#include "proto/named_tensors.h"
#include "proto/slice_plan.h"
#include "proto/tensor_spec.h"
#include "proto/topk_codec.h"

namespace diloco {

constexpr int64_t kDefaultChunkBytes = 1 << 20;
constexpr int64_t kMinChunkBytes = 64;  // smaller chunk_bytes are raised to this

class TensorChunker {
 public:
  // Tensors must be on the CPU; non-contiguous ones are made contiguous once, here. With CODEC_TOPK a float32
  // tensor travels in chunks of TopkChunkElements(chunk_bytes, topk) elements, each encoded with `topk`.
  TensorChunker(NamedTensors tensors, int64_t chunk_bytes, Codec codec = CODEC_RAW, TopkParams topk = {});
  // Only elements [range.begin, range.end) of the tensors flattened end to end (a part of a push or pull in parts,
  // PROTOCOL.md): the first chunk may start mid-tensor, and a chunk never crosses range.end. With CODEC_TOPK a
  // range that starts inside a block of topk.chunk elements of its tensor sends the elements up to that block's end
  // as one raw chunk first (a topk chunk must start a block). The range must lie in [0, total elements]
  // (std::out_of_range otherwise).
  TensorChunker(NamedTensors tensors, int64_t chunk_bytes, Codec codec, FlatRange range, TopkParams topk = {});
  // The same stream of elements [range.begin, range.end) of tensors shaped as `specs` (float32, laid end to end),
  // from a buffer holding only those elements (`range_values`: 1-D, contiguous, CPU, range.size() elements): a
  // cluster rank's part of a push without a full-size copy of the model (worker/part_exchange.h).
  TensorChunker(const std::vector<TensorSpec>& specs, at::Tensor range_values, int64_t chunk_bytes, Codec codec,
                FlatRange range, TopkParams topk = {});
  // Chunks encoded beforehand (a worker's error feedback encodes its topk push once, worker/error_feedback.h): Next
  // hands them out in order, unchanged.
  explicit TensorChunker(std::vector<TensorChunk> encoded);

  // Fills `out` with the next chunk; returns false when every tensor has been sent.
  bool Next(TensorChunk* out);
  // The same, except that a raw (fp32, or non-float) chunk's bytes are not copied into out->data: *raw_payload
  // points at them in the tensor's memory (valid while this chunker lives) and out->data is left empty. Encoded
  // chunks fill out->data as Next does, and *raw_payload is empty.
  bool Next(TensorChunk* out, std::string_view* raw_payload);

  // Encoded payload bytes of the chunks produced so far.
  int64_t bytes_emitted() const { return bytes_emitted_; }

 private:
  NamedTensors tensors_;  // flattened elements [origin_[i], origin_[i] + numel) of tensor i (all of it: origin 0)
  std::vector<int64_t> origin_;
  std::vector<std::vector<int64_t>> shape_;  // tensor i's whole shape
  std::vector<int64_t> numel_;               // ... and element count
  int64_t chunk_bytes_;
  Codec codec_;
  TopkParams topk_;
  size_t index_ = 0;
  int64_t offset_ = 0;     // in elements, within tensors_[index_]
  int64_t remaining_ = 0;  // elements still to send
  int64_t bytes_emitted_ = 0;
  std::vector<TensorChunk> encoded_;  // the replayed chunks (encoded constructor), else empty
  size_t next_encoded_ = 0;
  bool replay_ = false;
};

class ChunkStreamReader {
 public:
  explicit ChunkStreamReader(std::vector<TensorSpec> specs);
  // A stream of only elements [range.begin, range.end) of the specs' tensors flattened end to end (a part of a push
  // in parts): it starts at the tensor and offset of range.begin and is done at range.end; a chunk may not cross it.
  // The range must lie in [0, total elements] (std::out_of_range otherwise).
  ChunkStreamReader(std::vector<TensorSpec> specs, FlatRange range);

  // Validates `chunk` as the next one of the stream. On success returns its count values as a 1-D tensor: for raw
  // chunks a view of chunk.data(), valid only while `chunk` is alive and unchanged; else decoded float32.
  absl::StatusOr<at::Tensor> Next(const TensorChunk& chunk);
  // The same for a CODEC_TOPK chunk of a float32 tensor, without densifying it: the kept values and their positions
  // relative to the chunk's first element (proto/topk_codec.h DecodeTopk, with all its checks).
  absl::StatusOr<SparseChunk> NextSparse(const TensorChunk& chunk);

  // Index into specs of the tensor the last accepted chunk belonged to, and that chunk's element offset.
  size_t tensor_index() const { return last_index_; }
  int64_t chunk_offset() const { return last_offset_; }

  // True once every element of every tensor (of the range) has arrived.
  bool Done() const { return remaining_ == 0; }

  // Where the stream stands, for error messages ("tensor 3/10 'blocks.0.attn.qkv.weight' at element 4096").
  std::string Position() const;

 private:
  void SkipEmpty();                                        // moves past zero-element tensors and a finished tensor
  absl::Status CheckNext(const TensorChunk& chunk) const;  // name, dtype, shape, offset, count
  void Advance(int64_t count);                             // after an accepted chunk
  std::vector<TensorSpec> specs_;
  size_t index_ = 0;
  int64_t offset_ = 0;
  int64_t remaining_ = 0;  // elements still expected
  size_t last_index_ = 0;
  int64_t last_offset_ = 0;
};

// Copies every chunk of a stream into preallocated tensors (used by the pull on the worker side).
class ChunkAssembler {
 public:
  // `dest` tensors must be contiguous CPU tensors whose specs the stream must match.
  explicit ChunkAssembler(NamedTensors dest);
  absl::Status Accept(const TensorChunk& chunk);
  bool Done() const { return reader_.Done(); }

 private:
  NamedTensors dest_;
  ChunkStreamReader reader_;
};

}  // namespace diloco
