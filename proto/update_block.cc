// One CODEC_UPDATE block (proto/update_block.h): the encoder's choices and the decoder with every check.
#include "proto/update_block.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <queue>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace diloco {
namespace {

constexpr uint32_t kMagnitudeMask = 0x7fffffffu;
constexpr int kMaxRice = 15;
constexpr int kMaxCodeLength = 15;  // Huffman code lengths: 1..15 (0: the symbol is absent)
constexpr int kHuffmanCode = 3;     // k = 3: canonical Huffman indices, the last symbol an inline sum
constexpr int kPairLiterals = 64;   // sums of two are searched among this many literals
constexpr int kTripleLiterals = 8;  // sums of three among this many

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

// ceil(log2 n) bits name n things (0 for one).
int WidthFor(int64_t n) {
  int bits = 0;
  while ((int64_t{1} << bits) < n) ++bits;
  return bits;
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Little-endian bit stream (bit 0 of a byte first, values low bit first).
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
  void Unary(uint64_t q) {
    for (; q > 0; --q) PutBit(1);
    PutBit(0);
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

// Exp-Golomb of order k: v = n + 2^k has q + k + 1 bits; q ones, a zero, then the low q + k bits of v.
int ExpGolombQ(uint64_t n, int k) { return WidthFor(static_cast<int64_t>((n >> k) + 2)) - 1; }
int ExpGolombCost(uint64_t n, int k) { return 2 * ExpGolombQ(n, k) + 1 + k; }

int LiteralLength(uint32_t magnitude) {
  const uint32_t mantissa = magnitude & 0x7fffffu;
  return mantissa == 0 ? 0 : 23 - __builtin_ctz(mantissa);
}

struct Composite {
  uint32_t magnitude = 0;
  int terms = 2;
  int index[3] = {0, 0, 0};
  bool minus[3] = {false, false, false};  // minus[t]: term t (>= 1) is subtracted
};

uint32_t Combine(const std::vector<float>& literals, const Composite& c) {
  float v = literals[c.index[0]];
  for (int t = 1; t < c.terms; ++t) v = c.minus[t] ? v - literals[c.index[t]] : v + literals[c.index[t]];
  return Bits(v) & kMagnitudeMask;
}

// The block's distinct magnitudes split into literals and sums of literals (greedy, most frequent first).
class MagnitudeTable {
 public:
  void Add(uint32_t magnitude) {
    const int b = static_cast<int>(literals_.size());
    const int width = WidthFor(b + 1);
    const int literal_bits = 6 + LiteralLength(magnitude);  // about: the exponent's and length's changes are short
    if (b > 0 && 1 + 2 * width + 1 < literal_bits) {
      if (auto it = pairs_.find(magnitude); it != pairs_.end()) return composites_.push_back(it->second);
      if (1 + 3 * width + 2 < literal_bits && FindTriple(magnitude)) return;
    }
    literals_.push_back(magnitude);
    values_.push_back(FromBits(magnitude));
    if (b >= kPairLiterals) return;
    for (int i = 0; i <= b; ++i) {
      for (bool minus : {false, true}) {
        if (i == b && minus) continue;  // x - x = 0: a literal 0 costs as little
        Composite c;
        c.index[0] = i;
        c.index[1] = b;
        c.minus[1] = minus;
        c.magnitude = Combine(values_, c);
        if (std::isfinite(FromBits(c.magnitude))) pairs_.emplace(c.magnitude, c);
      }
    }
  }
  const std::vector<uint32_t>& literals() const { return literals_; }
  const std::vector<Composite>& composites() const { return composites_; }

 private:
  bool FindTriple(uint32_t magnitude) {
    const int n = std::min<int>(kTripleLiterals, static_cast<int>(literals_.size()));
    Composite c;
    c.terms = 3;
    for (int i = 0; i < n; ++i) {
      for (int j = i; j < n; ++j) {
        for (int k = j; k < n; ++k) {
          for (int s = 0; s < 4; ++s) {
            c.index[0] = i, c.index[1] = j, c.index[2] = k;
            c.minus[1] = s & 1, c.minus[2] = (s >> 1) & 1;
            if (Combine(values_, c) == magnitude) {
              c.magnitude = magnitude;
              composites_.push_back(c);
              return true;
            }
          }
        }
      }
    }
    return false;
  }

  std::vector<uint32_t> literals_;
  std::vector<float> values_;
  std::vector<Composite> composites_;
  std::unordered_map<uint32_t, Composite> pairs_;
};

int BestRice(const std::vector<uint64_t>& gaps) {
  int best = 0;
  uint64_t best_cost = UINT64_MAX;
  for (int r = 0; r <= kMaxRice; ++r) {
    uint64_t cost = gaps.size() * (1 + static_cast<uint64_t>(r));
    for (uint64_t g : gaps) cost += g >> r;
    if (cost < best_cost) best = r, best_cost = cost;
  }
  return best;
}

// The cheapest of k = 0 (fixed width) and 1, 2 (exp-Golomb of order k - 1) for indices with these counts; *bits
// its cost. counts[i]: the positions whose magnitude is entry i.
int BestIndexCode(const std::vector<int64_t>& counts, int64_t* bits) {
  int64_t best_cost = 0;
  for (int64_t n : counts) best_cost += n * WidthFor(static_cast<int64_t>(counts.size()));
  int best = 0;
  for (int k = 1; k <= 2; ++k) {
    int64_t cost = 0;
    for (size_t i = 0; i < counts.size(); ++i) cost += counts[i] * ExpGolombCost(i, k - 1);
    if (cost < best_cost) best = k, best_cost = cost;
  }
  *bits = best_cost;
  return best;
}

// Huffman code lengths for the counts (0 for a count of 0): empty when fewer than two counts are positive or a
// length would pass kMaxCodeLength. Ties merge the lower node id first, so the lengths are deterministic.
std::vector<int> HuffmanLengths(const std::vector<int64_t>& counts) {
  using Node = std::pair<int64_t, int>;  // (weight, id)
  std::priority_queue<Node, std::vector<Node>, std::greater<Node>> queue;
  std::vector<int> parent(2 * counts.size(), -1);
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > 0) queue.push({counts[i], static_cast<int>(i)});
  }
  if (queue.size() < 2) return {};
  int next = static_cast<int>(counts.size());
  while (queue.size() > 1) {
    const Node a = queue.top();
    queue.pop();
    const Node b = queue.top();
    queue.pop();
    parent[a.second] = parent[b.second] = next;
    queue.push({a.first + b.first, next++});
  }
  std::vector<int> lengths(counts.size(), 0);
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    for (int j = parent[i]; j >= 0; j = parent[j]) ++lengths[i];
    if (lengths[i] > kMaxCodeLength) return {};
  }
  return lengths;
}

// Canonical codes for the lengths (DEFLATE's rule: shorter codes first, ties by symbol order).
std::vector<uint32_t> CanonicalCodes(const std::vector<int>& lengths) {
  int count[kMaxCodeLength + 1] = {0};
  for (int l : lengths) ++count[l];
  count[0] = 0;
  uint32_t next[kMaxCodeLength + 1] = {0}, code = 0;
  for (int l = 1; l <= kMaxCodeLength; ++l) next[l] = code = (code + count[l - 1]) << 1;
  std::vector<uint32_t> codes(lengths.size(), 0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] > 0) codes[i] = next[lengths[i]]++;
  }
  return codes;
}

void PutExpGolomb(BitWriter& bits, uint64_t n, int k) {
  const int q = ExpGolombQ(n, k);
  bits.Unary(q);
  bits.Put(n + (uint64_t{1} << k) - (uint64_t{1} << (q + k)), q + k);
}

uint64_t ZigZag(int64_t v) { return v >= 0 ? 2 * static_cast<uint64_t>(v) : 2 * static_cast<uint64_t>(-v) - 1; }

// The literals: the first's e and L in full, later ones' changes of both, then each one's L high mantissa bits.
void PutLiterals(BitWriter& bits, const std::vector<uint32_t>& literals) {
  int64_t previous_e = -1, previous_l = 0;
  for (uint32_t m : literals) {
    const int64_t e = m >> 23, l = LiteralLength(m);
    if (previous_e < 0) {
      bits.Put(e, 8);
      bits.Put(l, 5);
    } else {  // later literals: the changes of e and L, zigzag, exp-Golomb of order 0
      PutExpGolomb(bits, ZigZag(e - previous_e), 0);
      PutExpGolomb(bits, ZigZag(l - previous_l), 0);
    }
    bits.Put((m & 0x7fffffu) >> (23 - l), static_cast<int>(l));
    previous_e = e, previous_l = l;
  }
}

// One sum (in the table or inline): t, the terms' literal indices in `width` bits, the minus bits.
int SumBits(const Composite& c, int width) { return 1 + c.terms * width + c.terms - 1; }
void PutSum(BitWriter& bits, const Composite& c, int width) {
  bits.PutBit(c.terms == 3);
  for (int t = 0; t < c.terms; ++t) bits.Put(c.index[t], width);
  for (int t = 1; t < c.terms; ++t) bits.PutBit(c.minus[t]);
}

// The Huffman code lengths of the symbols: the first in 4 bits, each later one's change, zigzag, exp-Golomb(0).
int64_t LengthTableBits(const std::vector<int>& lengths) {
  int64_t bits = 4;
  for (size_t i = 1; i < lengths.size(); ++i) bits += ExpGolombCost(ZigZag(lengths[i] - lengths[i - 1]), 0);
  return bits;
}
void PutLengthTable(BitWriter& bits, const std::vector<int>& lengths) {
  bits.Put(lengths[0], 4);
  for (size_t i = 1; i < lengths.size(); ++i) PutExpGolomb(bits, ZigZag(lengths[i] - lengths[i - 1]), 0);
}

// How a block names its magnitudes: the index code and, per entry of its MagnitudeTable (the literals, then the sums),
// the symbol its positions send. Under Huffman the last symbol is the escape: a sum with that symbol is sent inline
// after it instead of in the table.
struct IndexPlan {
  int code = 0;
  std::vector<uint64_t> symbol;  // per table entry
  std::vector<int64_t> counts;   // positions per symbol
  std::vector<int> lengths;      // Huffman only
  int64_t bits = 0;              // the sums + the length table + the indices
  bool Inline(size_t entry) const { return code == kHuffmanCode && symbol[entry] == counts.size() - 1; }
};

// The cheapest plan for a table whose entries are used entry_counts times: every sum in the table with a fixed-width,
// exp-Golomb or Huffman index, or Huffman with the sums used once inline.
IndexPlan PlanIndices(const MagnitudeTable& table, const std::vector<int64_t>& entry_counts) {
  const size_t b = table.literals().size(), n = entry_counts.size();
  int64_t sum_bits = 0;  // the same in every plan: each sum is written once, in the table or inline
  for (const Composite& c : table.composites()) sum_bits += SumBits(c, WidthFor(static_cast<int64_t>(b)));
  IndexPlan best;
  best.counts = entry_counts;
  for (size_t i = 0; i < n; ++i) best.symbol.push_back(i);
  int64_t index_bits = 0;
  best.code = BestIndexCode(best.counts, &index_bits);
  best.bits = sum_bits + index_bits;
  for (bool inline_once : {false, true}) {
    const auto once = [&](size_t i) { return inline_once && i >= b && entry_counts[i] == 1; };
    int64_t escapes = 0;
    for (size_t i = 0; i < n; ++i) escapes += once(i);
    IndexPlan h;
    h.code = kHuffmanCode;
    const uint64_t escape = n - escapes;
    h.counts.assign(escape + 1, 0);
    h.counts[escape] = escapes;
    for (size_t i = 0, next = 0; i < n; ++i) {
      h.symbol.push_back(once(i) ? escape : next);
      if (!once(i)) h.counts[next++] = entry_counts[i];
    }
    h.lengths = HuffmanLengths(h.counts);
    if (h.lengths.empty()) continue;
    h.bits = sum_bits + LengthTableBits(h.lengths);
    for (size_t i = 0; i < h.counts.size(); ++i) h.bits += h.counts[i] * h.lengths[i];
    if (h.bits < best.bits) best = std::move(h);
  }
  return best;
}

}  // namespace

bool UpdateReader::Varint(uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (at_ >= n_) return false;
    const uint8_t byte = p_[at_++];
    *v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

bool UpdateReader::Bit(uint32_t* bit) {
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

bool UpdateReader::Bits(int width, uint64_t* v) {
  *v = 0;
  for (int b = 0; b < width; ++b) {
    uint32_t bit;
    if (!Bit(&bit)) return false;
    *v |= static_cast<uint64_t>(bit) << b;
  }
  return true;
}

bool UpdateReader::Unary(uint64_t limit, uint64_t* q) {
  *q = 0;
  for (uint32_t bit = 1;;) {
    if (!Bit(&bit)) return false;
    if (bit == 0) return true;
    if (++*q > limit) return false;
  }
}

void EncodeUpdateBlock(const float* delta, int64_t length, float minus_lr, std::string* out, int64_t* changed) {
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
  std::unordered_map<uint32_t, int64_t> frequency;
  for (uint32_t s : steps) ++frequency[s & kMagnitudeMask];
  std::vector<std::pair<int64_t, uint32_t>> order;  // (-count, magnitude): most frequent first, then ascending
  for (const auto& [magnitude, n] : frequency) order.push_back({-n, magnitude});
  std::sort(order.begin(), order.end());
  MagnitudeTable table;
  for (const auto& [n, magnitude] : order) table.Add(magnitude);
  const int b = static_cast<int>(table.literals().size());
  const std::vector<Composite>& sums = table.composites();
  std::vector<int64_t> entry_counts;
  std::unordered_map<uint32_t, size_t> entry;  // magnitude -> table entry
  for (uint32_t m : table.literals()) {
    entry[m] = entry_counts.size();
    entry_counts.push_back(frequency[m]);
  }
  for (const Composite& c : sums) {
    entry[c.magnitude] = entry_counts.size();
    entry_counts.push_back(frequency[c.magnitude]);
  }
  const IndexPlan plan = PlanIndices(table, entry_counts);
  std::vector<uint64_t> gaps;
  for (int64_t i = 0, previous = -1; i < u; previous = positions[i++]) {
    gaps.push_back(static_cast<uint64_t>(positions[i] - previous - 1));
  }
  uint64_t table_sums = 0;
  for (size_t j = 0; j < sums.size(); ++j) table_sums += !plan.Inline(b + j);
  PutVarint(out, b);
  PutVarint(out, table_sums);
  BitWriter bits(out);
  const int r = BestRice(gaps), width = WidthFor(b);
  bits.Put(r, 4);
  bits.Put(plan.code, 2);
  PutLiterals(bits, table.literals());
  for (size_t j = 0; j < sums.size(); ++j) {
    if (!plan.Inline(b + j)) PutSum(bits, sums[j], width);
  }
  if (plan.code == kHuffmanCode) PutLengthTable(bits, plan.lengths);
  for (uint64_t g : gaps) {
    bits.Unary(g >> r);
    bits.Put(g, r);
  }
  const std::vector<uint32_t> codes =
      plan.code == kHuffmanCode ? CanonicalCodes(plan.lengths) : std::vector<uint32_t>();
  const int index_width = WidthFor(static_cast<int64_t>(plan.counts.size()));
  for (uint32_t s : steps) {
    const size_t e = entry[s & kMagnitudeMask];
    const uint64_t symbol = plan.symbol[e];
    if (plan.code == 0) {
      bits.Put(symbol, index_width);
    } else if (plan.code < kHuffmanCode) {
      PutExpGolomb(bits, symbol, plan.code - 1);
    } else {
      for (int k = plan.lengths[symbol] - 1; k >= 0; --k) bits.PutBit((codes[symbol] >> k) & 1);
      if (plan.Inline(e)) PutSum(bits, sums[e - b], width);
    }
    bits.PutBit(s >> 31);
  }
  bits.Flush();
}

namespace {

bool ReadExpGolomb(UpdateReader& in, int k, uint64_t* n) {
  uint64_t q = 0, low = 0;
  if (!in.Unary(16, &q) || !in.Bits(static_cast<int>(q) + k, &low)) return false;
  *n = low + (uint64_t{1} << (q + k)) - (uint64_t{1} << k);
  return true;
}

int64_t UnZigZag(uint64_t z) { return (z & 1) ? -static_cast<int64_t>((z + 1) / 2) : static_cast<int64_t>(z / 2); }

// One sum (a table entry or inline): t, 2 + t literal indices (< b), 1 + t minus bits; its magnitude into *v.
std::string ReadSum(uint64_t b, UpdateReader& in, const std::vector<float>& literals, float* v) {
  const int width = WidthFor(static_cast<int64_t>(b));
  uint32_t three = 0;
  Composite composite;
  if (!in.Bit(&three)) return "payload ends inside a sum";
  composite.terms = three ? 3 : 2;
  for (int t = 0; t < composite.terms; ++t) {
    uint64_t k = 0;
    if (!in.Bits(width, &k)) return "payload ends inside a sum";
    if (k >= b) return absl::StrCat("sum term ", k, " out of ", b, " literals");
    composite.index[t] = static_cast<int>(k);
  }
  for (int t = 1; t < composite.terms; ++t) {
    uint32_t minus = 0;
    if (!in.Bit(&minus)) return "payload ends inside a sum";
    composite.minus[t] = minus;
  }
  *v = FromBits(Combine(literals, composite));
  if (!std::isfinite(*v)) return "non-finite sum";
  return "";
}

// The magnitudes of a block: b literals then the composites; an error text or "".
std::string DecodeMagnitudes(uint64_t b, uint64_t c, UpdateReader& in, std::vector<float>* table) {
  int64_t e = 0, l = 0;
  for (uint64_t i = 0; i < b; ++i) {
    uint64_t high = 0;
    if (i == 0) {
      uint64_t e0 = 0, l0 = 0;
      if (!in.Bits(8, &e0)) return "payload ends inside a literal";
      if (e0 == 255) return "non-finite literal";
      if (!in.Bits(5, &l0)) return "payload ends inside a literal";
      e = static_cast<int64_t>(e0), l = static_cast<int64_t>(l0);
    } else {
      uint64_t de = 0, dl = 0;
      if (!ReadExpGolomb(in, 0, &de) || !ReadExpGolomb(in, 0, &dl)) return "literal change too long or cut";
      e += UnZigZag(de), l += UnZigZag(dl);
      if (e < 0 || e > 254) return absl::StrCat("literal exponent ", e, " out of [0, 254]");
    }
    if (l < 0 || l > 23) return absl::StrCat("literal length ", l, " out of [0, 23]");
    if (!in.Bits(static_cast<int>(l), &high)) return "payload ends inside a literal";
    table->push_back(FromBits(static_cast<uint32_t>((e << 23) | (high << (23 - l)))));
  }
  for (uint64_t i = 0; i < c; ++i) {
    float v = 0;
    if (std::string bad = ReadSum(b, in, *table, &v); !bad.empty()) return bad;
    table->push_back(v);
  }
  return "";
}

// A canonical Huffman code read from its length table (k = 3): m lengths in 0..15 that fill the code space exactly.
class HuffmanReader {
 public:
  std::string ReadLengths(uint64_t m, UpdateReader& in) {
    int64_t length = 0, used = 0;
    std::vector<int> lengths;
    for (uint64_t i = 0; i < m; ++i) {
      if (i == 0) {
        uint64_t first = 0;
        if (!in.Bits(4, &first)) return "payload ends inside the code lengths";
        length = static_cast<int64_t>(first);
      } else {
        uint64_t z = 0;
        if (!ReadExpGolomb(in, 0, &z)) return "code length change too long or cut";
        length += UnZigZag(z);
      }
      if (length < 0 || length > kMaxCodeLength) return absl::StrCat("code length ", length, " out of [0, 15]");
      lengths.push_back(static_cast<int>(length));
      if (length > 0) used += int64_t{1} << (kMaxCodeLength - length);
    }
    // A complete code of lengths >= 1 has at least two symbols.
    if (used != (int64_t{1} << kMaxCodeLength)) return "code lengths do not make a complete code";
    for (int l = 1; l <= kMaxCodeLength; ++l) {
      for (uint64_t i = 0; i < m; ++i) {
        if (lengths[i] != l) continue;
        ++count_[l];
        sorted_.push_back(static_cast<uint32_t>(i));
      }
    }
    return "";
  }

  // The next symbol: the code's bits, first bit most significant.
  bool Read(UpdateReader& in, uint64_t* symbol) const {
    int64_t code = 0, first = 0, index = 0;
    for (int l = 1; l <= kMaxCodeLength; ++l) {
      uint32_t bit = 0;
      if (!in.Bit(&bit)) return false;
      code |= bit;
      if (code < first + count_[l]) {
        *symbol = sorted_[index + code - first];
        return true;
      }
      index += count_[l];
      first = (first + count_[l]) << 1;
      code <<= 1;
    }
    return false;
  }

 private:
  int64_t count_[kMaxCodeLength + 1] = {0};
  std::vector<uint32_t> sorted_;  // symbols by (length, symbol)
};

}  // namespace

std::string DecodeUpdateBlock(int64_t length, int64_t base, UpdateReader& in, std::vector<int64_t>* index,
                              std::vector<float>* values) {
  uint64_t u = 0, b = 0, c = 0;
  if (!in.Varint(&u)) return "payload ends before the block's count";
  if (u > static_cast<uint64_t>(length)) return absl::StrCat(u, " changed of ", length);
  if (u == 0) return "";
  if (!in.Varint(&b) || b < 1 || b > u) return "literal count missing or not in [1, count]";
  if (!in.Varint(&c) || c > u - b) return "sum count missing or over count - literals";
  uint64_t r = 0, code = 0;
  if (!in.Bits(4, &r) || !in.Bits(2, &code)) return "payload ends inside the block's parameters";
  std::vector<float> table;
  if (std::string bad = DecodeMagnitudes(b, c, in, &table); !bad.empty()) return bad;
  // Huffman (k = 3): m + 1 symbols, the last an inline sum.
  const bool huffman = code == kHuffmanCode;
  const uint64_t m = b + c + (huffman ? 1 : 0);
  HuffmanReader huffman_code;
  if (huffman) {
    if (std::string bad = huffman_code.ReadLengths(m, in); !bad.empty()) return bad;
  }
  int64_t pos = -1;
  for (uint64_t i = 0; i < u; ++i) {
    uint64_t q = 0, low = 0;
    if (!in.Unary(static_cast<uint64_t>(length), &q)) return "position out of the block or payload ends";
    if (!in.Bits(static_cast<int>(r), &low)) return "payload ends inside a position";
    pos += static_cast<int64_t>((q << r) | low) + 1;
    if (pos >= length) return absl::StrCat("position ", pos, " out of the block of ", length);
    index->push_back(base + pos);
  }
  const int width = WidthFor(static_cast<int64_t>(m)), k = static_cast<int>(code) - 1;
  for (uint64_t i = 0; i < u; ++i) {
    uint64_t n = 0;
    if (code == 0) {
      if (!in.Bits(width, &n)) return "payload ends inside the indices";
    } else if (huffman) {
      if (!huffman_code.Read(in, &n)) return "payload ends inside the indices";
    } else if (!ReadExpGolomb(in, k, &n)) {
      return "index code too long or cut";
    }
    if (n >= m) return absl::StrCat("index ", n, " out of ", m, " magnitudes");
    float magnitude = 0;
    if (huffman && n == m - 1) {
      if (std::string bad = ReadSum(b, in, table, &magnitude); !bad.empty()) return bad;
    } else {
      magnitude = table[n];
    }
    uint32_t negative = 0;
    if (!in.Bit(&negative)) return "payload ends inside the indices";
    values->push_back(negative ? -magnitude : magnitude);
  }
  in.AlignToByte();
  return "";
}

}  // namespace diloco
