// The topk codec's sender side (proto/topk_codec.h): selection, 2-bit quantization and packing, and the sizes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/topk_codec.h"

namespace diloco {
namespace {

// float32 -> bfloat16 bits, round to nearest, ties to even (as tests/golden/topk_reference.py).
uint16_t ToBf16Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return static_cast<uint16_t>((static_cast<uint64_t>(u) + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

float FromBf16Bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// Appends `width`-bit values to a little-endian bit stream.
class BitWriter {
 public:
  explicit BitWriter(uint8_t* out) : out_(out) {}
  void Put(uint32_t value, int width) {
    acc_ |= static_cast<uint64_t>(value) << fill_;
    fill_ += width;
    while (fill_ >= 8) {
      *out_++ = static_cast<uint8_t>(acc_);
      acc_ >>= 8;
      fill_ -= 8;
    }
  }
  uint8_t* Flush() {
    if (fill_ > 0) *out_++ = static_cast<uint8_t>(acc_);
    acc_ = 0;
    fill_ = 0;
    return out_;
  }

 private:
  uint8_t* out_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

// The keep-th largest of mag[0..n). Exact, and mostly fast: a block of 1024 or more first takes t0, the
// (keep / 4)-th largest of every 8th element, so that about 2 keep elements are >= t0; when at least `keep` are, the
// answer is the keep-th largest of those few (every element of the top keep is >= t0); otherwise of the whole block.
// (It took the keep / 16-th before: about keep / 2 elements passed, fewer than keep, so every block fell back to the
// whole block.) scratch: n floats.
float KthLargest(const float* mag, int64_t n, int64_t keep, float* scratch) {
  constexpr int64_t kStride = 8;
  const int64_t sample_rank = 2 * keep / kStride;
  if (n >= 1024 && sample_rank >= 1 && sample_rank < n / kStride) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i += kStride) scratch[m++] = mag[i];
    std::nth_element(scratch, scratch + sample_rank, scratch + m, std::greater<float>());
    const float t0 = scratch[sample_rank];
    int64_t c = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (mag[i] >= t0) scratch[c++] = mag[i];
    }
    if (c >= keep) {
      std::nth_element(scratch, scratch + keep - 1, scratch + c, std::greater<float>());
      return scratch[keep - 1];
    }
  }
  std::copy(mag, mag + n, scratch);
  std::nth_element(scratch, scratch + keep - 1, scratch + n, std::greater<float>());
  return scratch[keep - 1];
}

// One block's selection: the positions of its `keep` largest magnitudes (ties: lower position), ascending, written
// to `positions`. mag holds |x| with NaN read as +inf; scratch is a buffer of at least n floats.
void SelectBlock(const float* mag, int64_t n, int64_t keep, float* scratch, std::vector<int32_t>& positions) {
  positions.clear();
  if (keep >= n) {
    for (int64_t i = 0; i < n; ++i) positions.push_back(static_cast<int32_t>(i));
    return;
  }
  const float t = KthLargest(mag, n, keep, scratch);  // the k-th largest magnitude
  int64_t above = 0;
  for (int64_t i = 0; i < n; ++i) above += mag[i] > t;
  int64_t ties = keep - above;  // how many of the values equal to t are kept: the lowest positions
  for (int64_t i = 0; i < n; ++i) {
    if (mag[i] > t || (mag[i] == t && ties-- > 0)) positions.push_back(static_cast<int32_t>(i));
  }
}

}  // namespace

absl::Status CheckTopkParams(const TopkParams& params) {
  if (params.chunk < 2 || params.chunk > kMaxTopkChunk || params.keep < 1 || params.keep > params.chunk) {
    return absl::InvalidArgumentError(absl::StrCat("topk keeps ", params.keep, " values per block of ", params.chunk,
                                                   " elements: expected 2 <= block <= ", kMaxTopkChunk,
                                                   " and 1 <= kept <= block"));
  }
  return absl::OkStatus();
}

int TopkPositionBits(int64_t chunk) {
  int bits = 1;
  while ((int64_t{1} << bits) < chunk) ++bits;
  return bits;
}

int64_t TopkKept(int64_t count, const TopkParams& params) {
  const int64_t full = count / params.chunk;
  return full * params.keep + std::min(params.keep, count % params.chunk);
}

int64_t TopkEncodedBytes(int64_t count, const TopkParams& params) {
  const int64_t blocks = (count + params.chunk - 1) / params.chunk;
  const int64_t kept = TopkKept(count, params);
  return 4 * blocks + (kept * TopkPositionBits(params.chunk) + 7) / 8 + (kept * 2 + 7) / 8;
}

int64_t TopkChunkElements(int64_t chunk_bytes, const TopkParams& params) {
  return std::max<int64_t>(1, chunk_bytes / params.chunk) * params.chunk;
}

void EncodeTopk(const at::Tensor& values, const TopkParams& params, TensorChunk* chunk) {
  const int64_t count = values.numel();
  const float* x = values.data_ptr<float>();
  const int64_t blocks = (count + params.chunk - 1) / params.chunk;
  const int64_t kept = TopkKept(count, params);
  const int pbits = TopkPositionBits(params.chunk);
  std::string data(static_cast<size_t>(TopkEncodedBytes(count, params)), '\0');
  auto* levels = reinterpret_cast<uint8_t*>(data.data());
  BitWriter pos(levels + 4 * blocks);
  BitWriter codes(levels + 4 * blocks + (kept * pbits + 7) / 8);
  std::vector<float> mag(static_cast<size_t>(params.chunk)), scratch(mag.size());
  std::vector<int32_t> positions;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * params.chunk;
    const int64_t n = std::min(params.chunk, count - b * params.chunk);
    for (int64_t i = 0; i < n; ++i) {
      mag[i] = std::isnan(xb[i]) ? std::numeric_limits<float>::infinity() : std::fabs(xb[i]);
    }
    SelectBlock(mag.data(), n, std::min(params.keep, n), scratch.data(), positions);
    float lo = std::numeric_limits<float>::infinity(), hi = 0;
    for (int32_t p : positions) {
      lo = std::min(lo, mag[p]);
      hi = std::max(hi, mag[p]);
    }
    const float d = hi - lo;
    const uint16_t b0 = ToBf16Bits(lo + d * 0.25f), b1 = ToBf16Bits(hi - d * 0.25f);
    const uint8_t le[4] = {static_cast<uint8_t>(b0), static_cast<uint8_t>(b0 >> 8), static_cast<uint8_t>(b1),
                           static_cast<uint8_t>(b1 >> 8)};
    std::memcpy(levels + 4 * b, le, 4);
    const float mid = (FromBf16Bits(b0) + FromBf16Bits(b1)) * 0.5f;
    for (int32_t p : positions) {
      pos.Put(static_cast<uint32_t>(p), pbits);
      codes.Put((xb[p] < 0 ? 1u : 0u) | (mag[p] > mid ? 2u : 0u), 2);
    }
  }
  pos.Flush();
  codes.Flush();
  chunk->set_codec(CODEC_TOPK);
  chunk->set_scale(0);
  chunk->set_lo(0);
  chunk->set_topk_chunk(params.chunk);
  chunk->set_topk_keep(params.keep);
  chunk->set_data(std::move(data));
}

}  // namespace diloco
