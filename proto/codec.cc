#include "proto/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/topk_codec.h"

namespace diloco {
namespace {

int Levels(Codec codec) { return codec == CODEC_INT8 ? 255 : 15; }

void SetBytes(const at::Tensor& t, TensorChunk* chunk) {
  chunk->set_data(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
}

}  // namespace

absl::StatusOr<Codec> CodecFromName(const std::string& name) {
  if (name == "fp32") return CODEC_RAW;
  if (name == "bf16") return CODEC_BF16;
  if (name == "fp16") return CODEC_FP16;
  if (name == "int8") return CODEC_INT8;
  if (name == "int4") return CODEC_INT4;
  if (name == "topk") return CODEC_TOPK;
  return absl::InvalidArgumentError(absl::StrCat("codec '", name, "': expected fp32, bf16, fp16, int8, int4 or topk"));
}

Codec CodecOf(WireCodec codec) {
  switch (codec) {
    case WireCodec::kFp32:
      return CODEC_RAW;
    case WireCodec::kBf16:
      return CODEC_BF16;
    case WireCodec::kFp16:
      return CODEC_FP16;
    case WireCodec::kInt8:
      return CODEC_INT8;
    case WireCodec::kInt4:
      return CODEC_INT4;
    case WireCodec::kTopk:
      return CODEC_TOPK;
  }
  return CODEC_RAW;
}

const char* CodecName(Codec codec) {
  switch (codec) {
    case CODEC_RAW:
      return "fp32";
    case CODEC_BF16:
      return "bf16";
    case CODEC_FP16:
      return "fp16";
    case CODEC_INT8:
      return "int8";
    case CODEC_INT4:
      return "int4";
    case CODEC_TOPK:
      return "topk";
    default:
      return "unknown";
  }
}

int64_t EncodedBytes(Codec codec, int64_t count, int64_t element_size) {
  switch (codec) {
    case CODEC_BF16:
    case CODEC_FP16:
      return 2 * count;
    case CODEC_INT8:
      return count;
    case CODEC_INT4:
      return (count + 1) / 2;
    case CODEC_TOPK:
      return TopkEncodedBytes(count, TopkParams{});
    default:
      return count * element_size;
  }
}

int64_t ChunkElements(Codec codec, int64_t chunk_bytes, int64_t element_size) {
  switch (codec) {
    case CODEC_BF16:
    case CODEC_FP16:
      return std::max<int64_t>(1, chunk_bytes / 2);
    case CODEC_INT8:
      return std::max<int64_t>(1, chunk_bytes);
    case CODEC_INT4:
      return std::max<int64_t>(2, 2 * chunk_bytes);
    case CODEC_TOPK:
      return TopkChunkElements(chunk_bytes, TopkParams{});
    default:
      return std::max<int64_t>(1, chunk_bytes / element_size);
  }
}

void EncodeValues(const at::Tensor& values, Codec codec, TensorChunk* chunk) {
  chunk->set_codec(codec);
  chunk->set_scale(0);
  chunk->set_lo(0);
  switch (codec) {
    case CODEC_RAW:
      SetBytes(values.contiguous(), chunk);
      return;
    case CODEC_BF16:
      SetBytes(values.to(at::kBFloat16), chunk);
      return;
    case CODEC_FP16:
      SetBytes(values.clamp(-65504.0, 65504.0).to(at::kHalf), chunk);
      return;
    case CODEC_INT8:
    case CODEC_INT4: {
      const float lo = values.min().item<float>();
      const float hi = values.max().item<float>();
      const float scale = hi > lo ? (hi - lo) / static_cast<float>(Levels(codec)) : 1.0f;
      at::Tensor q = values.sub(lo).div_(scale).round_().clamp_(0, Levels(codec)).to(at::kByte);
      chunk->set_scale(scale);
      chunk->set_lo(lo);
      if (codec == CODEC_INT8) {
        SetBytes(q, chunk);
        return;
      }
      if (q.numel() % 2 != 0) q = at::cat({q, at::zeros({1}, q.options())});
      at::Tensor pairs = q.view({-1, 2});
      SetBytes(pairs.select(1, 0).bitwise_or(pairs.select(1, 1).bitwise_left_shift(4)).contiguous(), chunk);
      return;
    }
    case CODEC_TOPK:
      EncodeTopk(values.contiguous(), TopkParams{}, chunk);
      return;
    default:
      SetBytes(values.contiguous(), chunk);
  }
}

absl::StatusOr<at::Tensor> DecodeValues(const TensorChunk& chunk, at::ScalarType dtype) {
  const int64_t count = chunk.count();
  const Codec codec = chunk.codec();
  if (codec != CODEC_RAW && dtype != at::kFloat) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", chunk.name(), "': codec ", CodecName(codec), " is only for float32 tensors"));
  }
  if (codec < CODEC_RAW || codec > CODEC_TOPK) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", chunk.name(), "': unknown codec ", codec));
  }
  if (codec == CODEC_TOPK) {
    absl::StatusOr<SparseChunk> sparse = DecodeTopk(chunk);
    if (!sparse.ok()) return sparse.status();
    return at::zeros({count}, at::kFloat).index_put_({sparse->index}, sparse->values);
  }
  const int64_t expected = EncodedBytes(codec, count, c10::elementSize(dtype));
  if (static_cast<int64_t>(chunk.data().size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", chunk.name(), "': chunk declares ", count, " elements (",
                                                   expected, " bytes as ", CodecName(codec), ") but carries ",
                                                   chunk.data().size(), " bytes"));
  }
  void* data = const_cast<char*>(chunk.data().data());
  switch (codec) {
    case CODEC_RAW:
      return at::from_blob(data, {count}, at::TensorOptions().dtype(dtype));
    case CODEC_BF16:
      return at::from_blob(data, {count}, at::kBFloat16).to(at::kFloat);
    case CODEC_FP16:
      return at::from_blob(data, {count}, at::kHalf).to(at::kFloat);
    default:
      break;
  }
  if (!std::isfinite(chunk.scale()) || !std::isfinite(chunk.lo()) || chunk.scale() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", chunk.name(), "': bad quantization scale ", chunk.scale(), " / lo ", chunk.lo()));
  }
  at::Tensor q = at::from_blob(data, {static_cast<int64_t>(chunk.data().size())}, at::kByte);
  if (codec == CODEC_INT4) {
    q = at::stack({q.bitwise_and(15), q.bitwise_right_shift(4)}, 1).view({-1}).narrow(0, 0, count);
  }
  return q.to(at::kFloat).mul_(chunk.scale()).add_(chunk.lo());
}

at::Tensor RoundTrip(const at::Tensor& flat, Codec codec, int64_t chunk_elements) {
  if (codec == CODEC_RAW) return flat;
  at::Tensor out = at::empty_like(flat);
  TensorChunk chunk;
  for (int64_t offset = 0; offset < flat.numel(); offset += chunk_elements) {
    const int64_t count = std::min(chunk_elements, flat.numel() - offset);
    chunk.set_count(count);
    EncodeValues(flat.narrow(0, offset, count), codec, &chunk);
    out.narrow(0, offset, count).copy_(DecodeValues(chunk, at::kFloat).value());
  }
  return out;
}

}  // namespace diloco
