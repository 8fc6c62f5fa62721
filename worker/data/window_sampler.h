// WindowSampler: the order in which one trainer draws the windows of its data shard (worker/data/shard_layout.h), and
// that order's state, so a restarted worker continues the same stream (SamplerState).
//   data.sampling random:     each draw is a uniformly random window start (with replacement), from std::mt19937_64
//                             seeded with the trainer's seed; the same draws TokenData::Sample makes with that RNG.
//   data.sampling sequential: epochs. Epoch e walks every sequential window of the shard (shard_layout.h: they cover
//                             every token; only a range's last one overlaps the one before it) exactly once, in the
//                             order of KeyedPermutation(windows, key(seed, e)); then epoch e + 1 begins, reshuffled.
//                             Draw p of epoch e is a pure function of (seed, e, p): O(1) memory for any shard size.
// Owns its RNG and position; a plain value, not thread-safe (one per trainer).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "config/config_enums.h"
#include "worker/data/keyed_permutation.h"
#include "worker/data/shard_layout.h"

namespace diloco {

struct SamplerState {
  int64_t epoch = 0;     // sequential: completed passes over the shard (random: 0)
  int64_t position = 0;  // sequential: windows drawn in this epoch; random: windows drawn in total
  std::string rng;       // random: the std::mt19937_64 state as text (operator<<); sequential: ""
};

struct WindowDraw {
  int64_t epoch;
  int64_t start;  // global token index of the window's first id
};

class WindowSampler {
 public:
  WindowSampler(DataSampling sampling, const ShardLayout& layout, uint64_t seed);

  // The next window; advances the state.
  WindowDraw Next();

  SamplerState state() const;
  // Continues from `state` (from state() of a sampler of the same kind, shard and seed): the next draws are the ones
  // that sampler would have made. InvalidArgument, naming what is wrong, for a state of the other kind, an
  // unreadable RNG, or a position past the shard's windows (both numbers named).
  absl::Status Restore(const SamplerState& state);

  // Sequential windows in the shard (ShardLayout::sequential_windows): one sequential epoch.
  int64_t windows_per_epoch() const { return layout_.sequential_windows(); }
  // Epochs so far as a fraction: sequential epoch + position / windows_per_epoch(); random: windows drawn /
  // windows_per_epoch() (as many tokens as one pass over the shard makes one epoch).
  double epochs() const;

  const ShardLayout& layout() const { return layout_; }

 private:
  const KeyedPermutation& Order();  // epoch_'s permutation, built on first use

  DataSampling sampling_;
  ShardLayout layout_;
  uint64_t seed_;
  std::mt19937_64 rng_;  // random only
  int64_t epoch_ = 0;
  int64_t position_ = 0;
  std::optional<KeyedPermutation> order_;  // sequential: the permutation of epoch order_epoch_
  int64_t order_epoch_ = -1;
};

// The key of sequential epoch `epoch` of a sampler seeded with `seed`.
uint64_t EpochKey(uint64_t seed, int64_t epoch);

// Random sampling's draw: a uniform window number in [0, layout.random_windows()) from `rng`, as its start.
int64_t DrawRandomStart(const ShardLayout& layout, std::mt19937_64& rng);

}  // namespace diloco
