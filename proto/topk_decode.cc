// The topk codec's receiver side (proto/topk_codec.h): every check a hostile chunk could fail, then the kept values.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/peer_text.h"
#include "proto/topk_codec.h"

namespace diloco {
namespace {

// Reads `width`-bit values from a little-endian bit stream (the caller has checked its length).
class BitReader {
 public:
  explicit BitReader(const uint8_t* in) : in_(in) {}
  uint32_t Get(int width) {
    while (fill_ < width) {
      acc_ |= static_cast<uint64_t>(*in_++) << fill_;
      fill_ += 8;
    }
    const auto v = static_cast<uint32_t>(acc_ & ((uint64_t{1} << width) - 1));
    acc_ >>= width;
    fill_ -= width;
    return v;
  }

 private:
  const uint8_t* in_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

float Bf16At(const uint8_t* p) {
  const uint32_t u = (static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8)) << 16;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

absl::Status Refuse(const TensorChunk& chunk, int64_t block, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor '", Truncated(chunk.name()), "': topk chunk at element ",
                                                 chunk.offset(), ", block ", block, ": ", what));
}

// The chunk-level checks: parameters, alignment, payload length.
absl::Status CheckShape(const TensorChunk& chunk, const TopkParams& params) {
  if (absl::Status s = CheckTopkParams(params); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", Truncated(chunk.name()), "': ", s.message()));
  }
  if (chunk.offset() % params.chunk != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", Truncated(chunk.name()), "': topk chunk at element ",
                                                   chunk.offset(), " does not start a block of ", params.chunk));
  }
  const int64_t expected = TopkEncodedBytes(chunk.count(), params);
  if (static_cast<int64_t>(chunk.data().size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", Truncated(chunk.name()), "': topk chunk of ", chunk.count(), " elements (", params.keep,
        " kept per ", params.chunk, ") takes ", expected, " bytes but carries ", chunk.data().size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SparseChunk> DecodeTopk(const TensorChunk& chunk) {
  const TopkParams params{chunk.topk_chunk(), chunk.topk_keep()};
  if (absl::Status s = CheckShape(chunk, params); !s.ok()) return s;
  const int64_t count = chunk.count();
  const int64_t blocks = (count + params.chunk - 1) / params.chunk;
  const int64_t kept = TopkKept(count, params);
  const int pbits = TopkPositionBits(params.chunk);
  const auto* levels = reinterpret_cast<const uint8_t*>(chunk.data().data());
  BitReader pos(levels + 4 * blocks);
  BitReader codes(levels + 4 * blocks + (kept * pbits + 7) / 8);
  SparseChunk out{at::empty({kept}, at::kLong), at::empty({kept}, at::kFloat)};
  int64_t* index = out.index.data_ptr<int64_t>();
  float* values = out.values.data_ptr<float>();
  int64_t i = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const float r0 = Bf16At(levels + 4 * b), r1 = Bf16At(levels + 4 * b + 2);
    if (!std::isfinite(r0) || !std::isfinite(r1) || !(r0 >= 0) || !(r1 >= r0)) {
      return Refuse(chunk, b, absl::StrCat("magnitude levels ", r0, ", ", r1, " (need finite 0 <= r0 <= r1)"));
    }
    const int64_t n = std::min(params.chunk, count - b * params.chunk);
    const int64_t k = std::min(params.keep, n);
    int64_t previous = -1;
    for (int64_t j = 0; j < k; ++j, ++i) {
      const int64_t p = pos.Get(pbits);
      if (p >= n) return Refuse(chunk, b, absl::StrCat("position ", p, " outside its ", n, " elements"));
      if (p <= previous) {
        return Refuse(chunk, b, absl::StrCat("position ", p, " after ", previous, " (positions must ascend)"));
      }
      previous = p;
      const uint32_t code = codes.Get(2);
      const float m = (code & 2) ? r1 : r0;
      index[i] = b * params.chunk + p;
      values[i] = (code & 1) ? -m : m;
    }
  }
  return out;
}

at::Tensor TopkRoundTrip(const at::Tensor& flat, const TopkParams& params, int64_t chunk_elements) {
  at::Tensor out = at::zeros_like(flat);
  TensorChunk chunk;
  for (int64_t offset = 0; offset < flat.numel(); offset += chunk_elements) {
    const int64_t count = std::min(chunk_elements, flat.numel() - offset);
    chunk.set_offset(offset);
    chunk.set_count(count);
    EncodeTopk(flat.narrow(0, offset, count).contiguous(), params, &chunk);
    SparseChunk sparse = DecodeTopk(chunk).value();
    out.narrow(0, offset, count).index_put_({sparse.index}, sparse.values);
  }
  return out;
}

}  // namespace diloco
