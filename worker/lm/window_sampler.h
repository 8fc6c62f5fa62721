// PLACEHOLDER (branch resume): the sampler state API that branch `data` implements; replaced by its header on merge.
#pragma once

#include <cstdint>
#include <string>

namespace diloco {

struct SamplerState {
  int64_t epoch = 0;     // sequential: completed passes over the shard (random: 0)
  int64_t position = 0;  // sequential: windows drawn in this epoch; random: windows drawn in total
  std::string rng;       // random: the std::mt19937_64 state as text (operator<<); sequential: ""
};
struct WindowDraw {
  int64_t epoch;
  int64_t start;
};

}  // namespace diloco
