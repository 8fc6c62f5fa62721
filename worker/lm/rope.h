// The rotary position embedding (RoPE) of the llama-shaped archs (llama, mistral, qwen2, qwen3), with the scalings
// model.rope_type names, exactly as transformers' modeling_rope_utils.py computes them (same float32 operations):
//   default: inv_freq[j] = 1 / rope_theta^(2j / hd), j < hd / 2 (hd = model.HeadDim()).
//   linear:  inv_freq / rope_factor.
//   llama3:  Llama 3.1's smoothing: wavelengths 2 pi / inv_freq above original / low_freq_factor are divided by
//            rope_factor, those below original / high_freq_factor kept, those between interpolated with
//            s = (original / wavelen - low) / (high - low): (1 - s) inv_freq / factor + s inv_freq.
//   yarn:    YaRN (arXiv 2309.00071): a linear ramp over the dimensions between the correction range of beta_fast and
//            beta_slow rotations (floored / ceiled, transformers' truncate) blends 1 / (factor theta^(2j/hd)) and
//            1 / theta^(2j/hd); cos and sin are scaled by the attention factor (default 0.1 ln(factor) + 1).
//   dynamic: dynamic NTK rescales theta only for positions past max_positions, which the models refuse: default.
// Tables: angle[t, :] = position t x [inv_freq, inv_freq] (float32), cos and sin of it times the attention scaling,
// cast to the activations' dtype. Pure functions; thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <utility>

#include "config/config.h"

namespace diloco {

struct RopeFrequencies {
  at::Tensor inv_freq;           // [HeadDim() / 2] float32 (ComputeRopeFrequencies: on the CPU)
  double attention_scaling = 1;  // multiplies cos and sin (yarn's attention factor; 1 otherwise)
};

// The frequencies of `model` (a llama-shaped ModelConfig; rope_type and the rope_* keys).
RopeFrequencies ComputeRopeFrequencies(const ModelConfig& model);

// cos and sin [T, hd] of positions start .. start + T - 1, in like's dtype and on its device.
std::pair<at::Tensor, at::Tensor> RotaryTables(const RopeFrequencies& rope, int64_t start, int64_t T,
                                               const at::Tensor& like);

}  // namespace diloco
