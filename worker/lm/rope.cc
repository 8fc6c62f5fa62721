#include "worker/lm/rope.h"

#include <algorithm>
#include <cmath>

namespace diloco {
namespace {

// theta^(2j / dim) for j < dim / 2, float32 (transformers: base ** (arange(0, dim, 2).float() / dim)).
at::Tensor PosFreqs(double theta, int64_t dim) {
  return at::pow(theta, at::arange(0, dim, 2, at::kFloat) / static_cast<double>(dim));
}

// Python's `scalar / tensor` is tensor.reciprocal() * scalar.
at::Tensor ScalarOver(double scalar, const at::Tensor& t) { return t.reciprocal() * scalar; }

at::Tensor Llama3(const ModelConfig& m, const at::Tensor& inv_freq) {
  const double factor = m.rope_factor, low = m.rope_low_freq_factor, high = m.rope_high_freq_factor;
  const double old_context = static_cast<double>(m.RopeOriginalMaxPositions());
  const double low_freq_wavelen = old_context / low, high_freq_wavelen = old_context / high;
  const at::Tensor wavelen = ScalarOver(2 * M_PI, inv_freq);
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  const at::Tensor smooth = (ScalarOver(old_context, wavelen) - low) / (high - low);
  const at::Tensor smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  const at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, scaled);
}

// The dimension at which `rotations` full turns fit in the original context (YaRN's correction dimension).
double CorrectionDim(double rotations, int64_t dim, double theta, double context) {
  return (dim * std::log(context / (rotations * 2 * M_PI))) / (2 * std::log(theta));
}

at::Tensor Yarn(const ModelConfig& m) {
  const int64_t dim = m.HeadDim();
  const double theta = m.rope_theta, factor = m.rope_factor;
  const double context = static_cast<double>(m.RopeOriginalMaxPositions());
  const at::Tensor pos_freqs = PosFreqs(theta, dim);
  const at::Tensor extrapolation = ScalarOver(1.0, pos_freqs);
  const at::Tensor interpolation = ScalarOver(1.0, factor * pos_freqs);
  double low = std::floor(CorrectionDim(m.rope_beta_fast, dim, theta, context));
  double high = std::ceil(CorrectionDim(m.rope_beta_slow, dim, theta, context));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers: prevent a singular ramp
  const at::Tensor ramp = ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
  const at::Tensor extrapolation_factor = 1 - ramp;
  return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
}

}  // namespace

RopeFrequencies ComputeRopeFrequencies(const ModelConfig& m) {
  RopeFrequencies out;
  const at::Tensor inv_freq = ScalarOver(1.0, PosFreqs(m.rope_theta, m.HeadDim()));
  switch (m.rope_type) {
    case RopeType::kDefault:
    case RopeType::kDynamic:  // dynamic NTK rescales only past max_positions, which no position reaches (the models
                              // refuse it): below it transformers' frequencies are the default ones
      out.inv_freq = inv_freq;
      break;
    case RopeType::kLinear:
      out.inv_freq = inv_freq / m.rope_factor;
      break;
    case RopeType::kLlama3:
      out.inv_freq = Llama3(m, inv_freq);
      break;
    case RopeType::kYarn:
      out.inv_freq = Yarn(m);
      out.attention_scaling = m.rope_attention_factor > 0 ? m.rope_attention_factor
                              : m.rope_factor <= 1        ? 1.0
                                                          : 0.1 * std::log(m.rope_factor) + 1.0;
      break;
  }
  return out;
}

std::pair<at::Tensor, at::Tensor> RotaryTables(const RopeFrequencies& rope, int64_t start, int64_t T,
                                               const at::Tensor& like) {
  auto f32 = at::TensorOptions().dtype(at::kFloat).device(like.device());
  const at::Tensor inv_freq = rope.inv_freq.to(like.device());
  const at::Tensor freqs = at::arange(start, start + T, f32).unsqueeze(1) * inv_freq.unsqueeze(0);  // [T, hd / 2]
  const at::Tensor angles = at::cat({freqs, freqs}, -1);                                            // [T, hd]
  at::Tensor cos = angles.cos(), sin = angles.sin();
  if (rope.attention_scaling != 1.0) {
    cos = cos * rope.attention_scaling;
    sin = sin * rope.attention_scaling;
  }
  return {cos.to(like.scalar_type()), sin.to(like.scalar_type())};
}

}  // namespace diloco
