// KeyedPermutation: a pseudo-random permutation of [0, n) chosen by a 64-bit key, evaluated one element at a time in
// O(1) memory (a shard's hundreds of millions of windows are shuffled without listing them). A balanced Feistel
// network over the smallest even number of bits 2h with 2^(2h) >= n (6 rounds, splitmix64-style round function keyed
// per round), restricted to [0, n) by cycle walking: re-apply until the value falls below n, which maps [0, n) onto
// itself one to one; 2^(2h) < 4n, so fewer than 4 applications are expected. Not cryptographic; deterministic across
// platforms. Immutable after construction; thread-safe.
#pragma once

#include <array>
#include <cstdint>

namespace diloco {

class KeyedPermutation {
 public:
  KeyedPermutation(uint64_t n, uint64_t key);

  uint64_t size() const { return n_; }
  // The image of i in [0, n).
  uint64_t operator()(uint64_t i) const;

 private:
  static constexpr int kRounds = 6;
  uint64_t Feistel(uint64_t x) const;

  uint64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  std::array<uint64_t, kRounds> round_keys_;
};

// splitmix64's finalizer: a bijective 64-bit mix (also how a (seed, epoch) pair becomes a key).
uint64_t Mix64(uint64_t x);

}  // namespace diloco
