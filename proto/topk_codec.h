// Sparse top-k codec (comm.codec topk, CODEC_TOPK): SparseLoCo's compression of the error-feedback accumulator
// (Sarfi et al., arXiv 2508.15706). A wire chunk of n elements of one float32 tensor (starting at a multiple of the
// block length B of that tensor) is cut into blocks of B elements (the tensor's last block may be shorter); each block
// keeps its k largest |x| (ties: the lower position; a block of m < k elements keeps m), and sends each kept value in
// 2 bits: bit 0 its sign (1 = negative), bit 1 which of the block's two magnitude levels r0 <= r1 it takes. With the
// block's kept magnitudes in [lo, hi]: r0 = lo + (hi - lo) / 4, r1 = hi - (hi - lo) / 4 (centres of the two halves),
// rounded to bfloat16; a value takes r1 when |x| > (r0 + r1) / 2. Payload, in this order (proto/PROTOCOL.md):
//   levels     every block's r0, r1 as little-endian bfloat16 (4 bytes a block)
//   positions  every kept position inside its block, ascending per block, P = ceil(log2 B) bits each (12 for 4096),
//              a little-endian bit stream (value i in bits [i P, (i + 1) P)), padded to a byte
//   codes      every kept value's 2-bit code in the same order, four to a byte, low bits first, padded to a byte
// At B = 4096, k = 64 a block costs 4 + 96 + 16 = 116 bytes against 16384 as fp32 (1/141).
// tests/golden/topk_reference.py is the independent reference. Pure functions; thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/diloco.pb.h"
#include "proto/topk_params.h"

namespace diloco {

constexpr int64_t kMaxTopkChunk = 1 << 16;

// InvalidArgument unless 2 <= chunk <= 65536 and 1 <= keep <= chunk.
absl::Status CheckTopkParams(const TopkParams& params);
// P: bits of one position, ceil(log2 chunk).
int TopkPositionBits(int64_t chunk);
// Values kept in `count` elements (blocks from the first element).
int64_t TopkKept(int64_t count, const TopkParams& params);
// Payload bytes of a wire chunk of `count` elements.
int64_t TopkEncodedBytes(int64_t count, const TopkParams& params);
// Elements per wire chunk: as many as an int8 chunk of chunk_bytes carries, in whole blocks (at least one).
int64_t TopkChunkElements(int64_t chunk_bytes, const TopkParams& params);

// Encodes values (1-D float32, contiguous, on the CPU; its element 0 starts a block) into chunk->data and sets codec,
// topk_chunk and topk_keep (scale and lo 0). Other fields are left alone. A non-finite value yields non-finite
// levels, which every receiver refuses.
void EncodeTopk(const at::Tensor& values, const TopkParams& params, TensorChunk* chunk);

// A decoded topk chunk: the kept values and their positions relative to the chunk's first element (ascending).
struct SparseChunk {
  at::Tensor index;   // int64 [K]
  at::Tensor values;  // float32 [K]
};

// Checks and decodes a CODEC_TOPK chunk of chunk.count() elements: InvalidArgument (naming the tensor and the block)
// for block parameters out of range, an offset that is not a multiple of the block, a payload of the wrong length,
// non-finite, negative or unordered levels, and positions out of their block, unsorted or repeated.
absl::StatusOr<SparseChunk> DecodeTopk(const TensorChunk& chunk);

// What a receiver sees for `flat` (1-D float32) sent with topk in wire chunks of chunk_elements (a multiple of
// params.chunk): the kept values decoded, zeros elsewhere. Used by error feedback.
at::Tensor TopkRoundTrip(const at::Tensor& flat, const TopkParams& params, int64_t chunk_elements);

}  // namespace diloco
