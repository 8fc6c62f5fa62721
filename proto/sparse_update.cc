// CODEC_UPDATE, the sparse pull's format (proto/sparse_update.h): encode, decode with every check, apply, hash.
#include "proto/sparse_update.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/peer_text.h"
#include "proto/topk_codec.h"

namespace diloco {
namespace {

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

int IndexBits(int64_t palette) {
  int bits = 0;
  while ((int64_t{1} << bits) < palette) ++bits;
  return bits;
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Little-endian bit stream (value bits low first), as topk's positions.
class BitWriter {
 public:
  explicit BitWriter(std::string* out) : out_(out) {}
  void Put(uint64_t v, int width) {
    for (int b = 0; b < width; ++b) PutBit((v >> b) & 1);
  }
  void PutBit(uint64_t bit) {
    acc_ |= bit << fill_;
    if (++fill_ == 8) Flush();
  }
  void Flush() {
    if (fill_ > 0) out_->push_back(static_cast<char>(acc_));
    acc_ = 0;
    fill_ = 0;
  }

 private:
  std::string* out_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

// Reads from data[*at, end); every read past the end fails instead of reading.
class ByteCursor {
 public:
  ByteCursor(const std::string& data) : p_(reinterpret_cast<const uint8_t*>(data.data())), n_(data.size()) {}
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at_ >= n_) return false;
      const uint8_t byte = p_[at_++];
      *v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }
  bool Float(float* x) {
    if (n_ - at_ < 4) return false;
    uint32_t u = 0;
    for (int i = 0; i < 4; ++i) u |= static_cast<uint32_t>(p_[at_++]) << (8 * i);
    *x = FromBits(u);
    return true;
  }
  bool Bit(uint32_t* bit) {
    if (fill_ == 0) {
      if (at_ >= n_) return false;
      acc_ = p_[at_++];
      fill_ = 8;
    }
    *bit = acc_ & 1;
    acc_ >>= 1;
    --fill_;
    return true;
  }
  bool Bits(int width, uint64_t* v) {
    *v = 0;
    for (int b = 0; b < width; ++b) {
      uint32_t bit;
      if (!Bit(&bit)) return false;
      *v |= static_cast<uint64_t>(bit) << b;
    }
    return true;
  }
  void AlignToByte() { fill_ = 0; }
  bool AtEnd() const { return at_ == n_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
  uint32_t acc_ = 0;
  int fill_ = 0;
};

// One block: its changed positions (relative to the block) and steps.
void EncodeBlock(const float* delta, int64_t length, float minus_lr, std::string* out, int64_t* changed) {
  std::vector<int64_t> positions;
  std::vector<uint32_t> steps;
  for (int64_t j = 0; j < length; ++j) {
    if (Bits(delta[j]) == 0) continue;  // +0: theta + fl(-lr * +0) is theta, bit for bit
    positions.push_back(j);
    steps.push_back(Bits(minus_lr * delta[j]));
  }
  const int64_t u = static_cast<int64_t>(positions.size());
  PutVarint(out, static_cast<uint64_t>(u));
  *changed += u;
  if (u == 0) return;
  std::vector<uint32_t> palette = steps;
  std::sort(palette.begin(), palette.end());
  palette.erase(std::unique(palette.begin(), palette.end()), palette.end());
  PutVarint(out, palette.size());
  for (uint32_t s : palette) {
    for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((s >> (8 * i)) & 0xff));
  }
  BitWriter bits(out);
  const int r = RiceParameter(length, u);
  int64_t previous = -1;
  for (int64_t pos : positions) {
    const uint64_t gap = static_cast<uint64_t>(pos - previous - 1);
    for (uint64_t q = gap >> r; q > 0; --q) bits.PutBit(1);
    bits.PutBit(0);
    bits.Put(gap, r);
    previous = pos;
  }
  const int width = IndexBits(static_cast<int64_t>(palette.size()));
  for (uint32_t s : steps) {
    bits.Put(static_cast<uint64_t>(std::lower_bound(palette.begin(), palette.end(), s) - palette.begin()), width);
  }
  bits.Flush();
}

absl::Status Refuse(const TensorChunk& chunk, int64_t block, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor '", Truncated(chunk.name()), "': update chunk at element ",
                                                 chunk.offset(), ", block ", block, ": ", what));
}

// Decodes one block of `length` elements starting at `base` (relative to the chunk) into out.
absl::Status DecodeBlock(const TensorChunk& chunk, int64_t block, int64_t length, int64_t base, ByteCursor& in,
                         std::vector<int64_t>* index, std::vector<float>* values) {
  uint64_t u = 0, p = 0;
  if (!in.Varint(&u)) return Refuse(chunk, block, "payload ends before the block's count");
  if (u > static_cast<uint64_t>(length)) return Refuse(chunk, block, absl::StrCat(u, " changed of ", length));
  if (u == 0) return absl::OkStatus();
  if (!in.Varint(&p) || p < 1 || p > u) return Refuse(chunk, block, "palette size missing or not in [1, count]");
  std::vector<float> palette(p);
  for (uint64_t i = 0; i < p; ++i) {
    if (!in.Float(&palette[i])) return Refuse(chunk, block, "payload ends inside the palette");
    if (!std::isfinite(palette[i])) return Refuse(chunk, block, "non-finite step");
    if (i > 0 && Bits(palette[i]) <= Bits(palette[i - 1])) return Refuse(chunk, block, "palette not ascending");
  }
  const int r = RiceParameter(length, static_cast<int64_t>(u));
  int64_t pos = -1;
  for (uint64_t i = 0; i < u; ++i) {
    uint64_t q = 0;
    uint32_t bit = 1;
    while (true) {
      if (!in.Bit(&bit)) return Refuse(chunk, block, "payload ends inside a position");
      if (bit == 0) break;
      if (++q > static_cast<uint64_t>(length)) return Refuse(chunk, block, "position out of the block");
    }
    uint64_t low = 0;
    if (!in.Bits(r, &low)) return Refuse(chunk, block, "payload ends inside a position");
    pos += static_cast<int64_t>((q << r) | low) + 1;
    if (pos >= length) return Refuse(chunk, block, absl::StrCat("position ", pos, " out of the block of ", length));
    index->push_back(base + pos);
  }
  const int width = IndexBits(static_cast<int64_t>(p));
  for (uint64_t i = 0; i < u; ++i) {
    uint64_t k = 0;
    if (!in.Bits(width, &k)) return Refuse(chunk, block, "payload ends inside the indices");
    if (k >= p) return Refuse(chunk, block, absl::StrCat("index ", k, " out of a palette of ", p));
    values->push_back(palette[k]);
  }
  in.AlignToByte();
  return absl::OkStatus();
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

int RiceParameter(int64_t length, int64_t changed) {
  const int64_t t = (length - changed) / std::max<int64_t>(1, changed) * 69 / 100;
  int r = 0;
  while ((int64_t{2} << r) <= t) ++r;
  return r;
}

int64_t EncodeUpdate(const float* delta, int64_t count, float minus_lr, int64_t block, TensorChunk* chunk) {
  std::string data;
  int64_t changed = 0;
  for (int64_t start = 0; start < count; start += block) {
    EncodeBlock(delta + start, std::min(block, count - start), minus_lr, &data, &changed);
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
  ByteCursor in(chunk.data());
  std::vector<int64_t> index;
  std::vector<float> values;
  for (int64_t start = 0, b = 0; start < chunk.count(); start += block, ++b) {
    absl::Status s = DecodeBlock(chunk, b, std::min(block, chunk.count() - start), start, in, &index, &values);
    if (!s.ok()) return s;
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
