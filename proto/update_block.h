// One block of a CODEC_UPDATE chunk (proto/PROTOCOL.md "CODEC_UPDATE", proto/sparse_update.h): the changed positions
// of up to topk_chunk elements and their float32 steps, coded losslessly. Per block, byte-aligned:
//   u        varint: changed positions (0..length); nothing else follows when 0
//   b, c     varints: literal magnitudes (1..u) and composite magnitudes (0..u - b); m = b + c distinct |step|s
//   bits     one little-endian bit stream, padded with zero bits to a byte:
//            r (4 bits): the Rice parameter of the position gaps; k (2 bits): the index code (0: fixed width
//            ceil(log2 m) bits, 1 and 2: exp-Golomb of order k - 1, 3: canonical Huffman over m + 1 symbols, the
//            last an escape followed by an inline sum);
//            b literals: the first's exponent e (8 bits, <= 254) and length L (5 bits, <= 23), each later one's
//            changes of e and L from the literal before (zigzag, exp-Golomb of order 0), then the L high bits of
//            the mantissa (the rest are zero);
//            c composites, each t (1 bit: two terms, or three), 2 + t literal indices of ceil(log2 b) bits, 1 + t
//            sign bits; the magnitude is |((M[i0] +- M[i1]) +- M[i2])| in float32, left to right (1: subtract);
//            k = 3: the m + 1 code lengths (0..15), the first in 4 bits, later ones' changes (zigzag, exp-Golomb 0);
//            the u positions as Rice-coded gaps (g_0 = pos_0, g_i = pos_i - pos_{i-1} - 1);
//            then per position its magnitude index (< m; k = 3: its code, and after the escape one sum as
//            above) and its sign bit (1: negative).
// Why: the steps of a round of W workers' top-k pushes are each one of the 4 per-block levels of a sender (times its
// weight), or, where several workers kept the same position, a sum of a few of them. A literal carries only the
// significant bits (a bf16 level keeps 8), a sum costs a few index bits instead of 32, and the index is coded by
// frequency rank (most steps are one of a few magnitudes) or by a Huffman code, under which a sum used by one position
// goes inline. The encoder's choices (which magnitudes are literals, which sums inline, r, k) are free: the decoder
// depends only on the format.
// Pure functions and value classes; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace diloco {

// Reads a CODEC_UPDATE payload: varints and a little-endian bit stream; every read past the end fails (false).
class UpdateReader {
 public:
  explicit UpdateReader(const std::string& data) : p_(reinterpret_cast<const uint8_t*>(data.data())), n_(data.size()) {}
  bool Varint(uint64_t* v);
  bool Bit(uint32_t* bit);
  bool Bits(int width, uint64_t* v);
  bool Unary(uint64_t limit, uint64_t* q);  // ones up to a zero; false past `limit` ones or the end
  void AlignToByte() { fill_ = 0; }
  bool AtEnd() const { return at_ == n_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
  uint32_t acc_ = 0;
  int fill_ = 0;
};

// Appends one block of `length` elements: the steps fl(minus_lr * delta[j]) wherever delta[j] is not +0.
// Adds the changed positions to *changed.
void EncodeUpdateBlock(const float* delta, int64_t length, float minus_lr, std::string* out, int64_t* changed);

// Decodes one block of `length` elements: appends base + position and the step of each changed position. An empty
// string when well formed, else what is wrong (the caller names the tensor, chunk and block).
std::string DecodeUpdateBlock(int64_t length, int64_t base, UpdateReader& in, std::vector<int64_t>* index,
                              std::vector<float>* values);

}  // namespace diloco
