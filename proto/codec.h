// Codecs for tensor chunks on the wire (issue: compressed pseudo-gradients). Each chunk of a float32 tensor is
// encoded on its own:
//   fp32  raw little-endian floats (exact; also how every non-float32 dtype travels)
//   bf16  bfloat16 (relative error <= 2^-8 per element), fp16 (relative <= 2^-11 within fp16 range)
//   int8  affine per chunk: q = round((x - lo) / scale), scale = (hi - lo) / 255, |error| <= scale / 2
//   int4  the same with 15 levels, two values per byte, |error| <= scale / 2
//   topk  sparse: per block the largest values, 2 bits each (proto/topk_codec.h; here with its default block and
//         count: TensorChunker takes others)
// scale and lo travel in the chunk (value = lo + q * scale). Pure functions; thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "absl/status/statusor.h"
#include "config/config_enums.h"
#include "proto/diloco.pb.h"

namespace diloco {

// "fp32" | "bf16" | "fp16" | "int8" | "int4" -> Codec; InvalidArgument names the accepted values.
absl::StatusOr<Codec> CodecFromName(const std::string& name);
const char* CodecName(Codec codec);
// The wire codec of a config value (comm.codec, comm.pull_codec).
Codec CodecOf(WireCodec codec);

// Bytes that `count` elements take on the wire with `codec` (element_size is the tensor dtype's, for fp32/raw).
int64_t EncodedBytes(Codec codec, int64_t count, int64_t element_size);

// Elements per chunk so that a chunk's encoded payload is about chunk_bytes.
int64_t ChunkElements(Codec codec, int64_t chunk_bytes, int64_t element_size);

// Encodes values (1-D, contiguous; float32 unless codec is CODEC_RAW) into chunk->data, and sets codec, scale and
// offset. Leaves the other chunk fields alone.
void EncodeValues(const at::Tensor& values, Codec codec, TensorChunk* chunk);

// Decodes a chunk's payload into a 1-D tensor of chunk.count() elements of `dtype`. For CODEC_RAW the result is a
// view of chunk.data() (valid while the chunk lives); otherwise a new float32 tensor. Checks the byte count.
absl::StatusOr<at::Tensor> DecodeValues(const TensorChunk& chunk, at::ScalarType dtype);

// What the receiver will see for `flat` (1-D float32) sent with `codec` in chunks of chunk_elements:
// used by error feedback to keep the quantization residual.
at::Tensor RoundTrip(const at::Tensor& flat, Codec codec, int64_t chunk_elements);

}  // namespace diloco
