#include "worker/data/window_sampler.h"

#include <sstream>

#include "absl/strings/str_cat.h"

namespace diloco {

uint64_t EpochKey(uint64_t seed, int64_t epoch) { return Mix64(Mix64(seed) ^ static_cast<uint64_t>(epoch)); }

int64_t DrawRandomStart(const ShardLayout& layout, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> pick(0, layout.random_windows() - 1);
  return layout.RandomStart(pick(rng));
}

WindowSampler::WindowSampler(DataSampling sampling, const ShardLayout& layout, uint64_t seed)
    : sampling_(sampling), layout_(layout), seed_(seed), rng_(seed) {}

const KeyedPermutation& WindowSampler::Order() {
  if (order_epoch_ != epoch_) {
    order_.emplace(static_cast<uint64_t>(windows_per_epoch()), EpochKey(seed_, epoch_));
    order_epoch_ = epoch_;
  }
  return *order_;
}

WindowDraw WindowSampler::Next() {
  if (sampling_ == DataSampling::kRandom) {
    ++position_;
    return {0, DrawRandomStart(layout_, rng_)};
  }
  const WindowDraw draw{epoch_, layout_.SequentialStart(static_cast<int64_t>(Order()(position_)))};
  if (++position_ == windows_per_epoch()) {
    ++epoch_;
    position_ = 0;
  }
  return draw;
}

SamplerState WindowSampler::state() const {
  SamplerState state;
  state.epoch = epoch_;
  state.position = position_;
  if (sampling_ == DataSampling::kRandom) {
    std::ostringstream rng;
    rng << rng_;
    state.rng = rng.str();
  }
  return state;
}

absl::Status WindowSampler::Restore(const SamplerState& state) {
  if (state.epoch < 0 || state.position < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler state: negative epoch ", state.epoch, " or position ", state.position));
  }
  if (sampling_ == DataSampling::kRandom) {
    if (state.rng.empty() || state.epoch != 0) {
      return absl::InvalidArgumentError("sampler state is from data.sampling sequential; this sampler is random");
    }
    std::istringstream text(state.rng);
    std::mt19937_64 rng;
    text >> rng;
    if (text.fail()) return absl::InvalidArgumentError("sampler state: the random generator's state is unreadable");
    rng_ = rng;
    position_ = state.position;
    return absl::OkStatus();
  }
  if (!state.rng.empty()) {
    return absl::InvalidArgumentError("sampler state is from data.sampling random; this sampler is sequential");
  }
  if (state.position > windows_per_epoch()) {
    return absl::InvalidArgumentError(absl::StrCat("sampler state: position ", state.position, " exceeds the shard's ",
                                                   windows_per_epoch(),
                                                   " windows (another data shard, seq_len or corpus?)"));
  }
  epoch_ = state.epoch;
  position_ = state.position;
  if (position_ == windows_per_epoch()) {  // a finished epoch: the next one begins
    ++epoch_;
    position_ = 0;
  }
  return absl::OkStatus();
}

double WindowSampler::epochs() const {
  const double per_epoch = static_cast<double>(windows_per_epoch());
  if (sampling_ == DataSampling::kRandom) return static_cast<double>(position_) / per_epoch;
  return static_cast<double>(epoch_) + static_cast<double>(position_) / per_epoch;
}

}  // namespace diloco
