#include "worker/data/keyed_permutation.h"

namespace diloco {

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

KeyedPermutation::KeyedPermutation(uint64_t n, uint64_t key) : n_(n) {
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  half_bits_ = bits / 2 + bits % 2;
  if (half_bits_ == 0) half_bits_ = 1;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t k = key;
  for (uint64_t& r : round_keys_) r = k = Mix64(k);
}

uint64_t KeyedPermutation::Feistel(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (const uint64_t k : round_keys_) {
    const uint64_t next = left ^ (Mix64(right ^ k) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t KeyedPermutation::operator()(uint64_t i) const {
  uint64_t x = Feistel(i);
  while (x >= n_) x = Feistel(x);
  return x;
}

}  // namespace diloco
