#include "coordinator/round_accumulator.h"

#include <cstring>
#include <stdexcept>
#include <utility>

namespace diloco {

bool AllFinite(const at::Tensor& values) {
  if (values.scalar_type() != at::kFloat || !values.is_contiguous()) return at::isfinite(values).all().item<bool>();
  const float* v = values.data_ptr<float>();
  const int64_t n = values.numel();
  constexpr uint32_t kExponent = 0x7f800000u;  // all exponent bits set: Inf or NaN
  uint32_t bad = 0;
  for (int64_t j = 0; j < n; ++j) {
    uint32_t bits;
    std::memcpy(&bits, v + j, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & kExponent) == kExponent);
  }
  return bad == 0;
}

RoundAccumulator::RoundAccumulator(const std::vector<TensorSpec>& specs) : count_(specs.size()) {
  for (const TensorSpec& s : specs) sums_.push_back(at::zeros(s.shape, at::kFloat));
}

void RoundAccumulator::Fold(size_t index, int64_t offset, const at::Tensor& values, double weight) {
  at::Tensor flat = sums_.at(index).view({-1});
  flat.narrow(0, offset, values.numel()).add_(values.to(at::kFloat), weight);
}

void RoundAccumulator::FoldSparse(size_t index, int64_t offset, const at::Tensor& positions, const at::Tensor& values,
                                  double weight) {
  float* sum = sums_.at(index).data_ptr<float>() + offset;
  const int64_t* p = positions.data_ptr<int64_t>();
  const float* v = values.data_ptr<float>();
  const auto w = static_cast<float>(weight);  // as Fold's add_ does: float32 arithmetic
  for (int64_t i = 0; i < values.numel(); ++i) sum[p[i]] += w * v[i];
}

void RoundAccumulator::AddContribution(double weight) {
  total_weight_ += weight;
  ++contributions_;
}

std::vector<at::Tensor> RoundAccumulator::Average() const {
  if (total_weight_ <= 0) throw std::logic_error("RoundAccumulator::Average with no contribution");
  std::vector<at::Tensor> out;
  out.reserve(sums_.size());
  for (const at::Tensor& s : sums_) out.push_back(s / total_weight_);
  return out;
}

std::vector<at::Tensor> RoundAccumulator::TakeAverage() {
  if (total_weight_ <= 0) throw std::logic_error("RoundAccumulator::TakeAverage with no contribution");
  for (at::Tensor& s : sums_) s.div_(total_weight_);
  total_weight_ = 0;
  contributions_ = 0;
  std::vector<at::Tensor> out;
  out.swap(sums_);
  return out;
}

void RoundAccumulator::Restore(std::vector<at::Tensor> zeroed) {
  if (!sums_.empty() || zeroed.size() != count_) throw std::logic_error("RoundAccumulator::Restore: not taken out");
  sums_ = std::move(zeroed);
}

void RoundAccumulator::Reset() {
  for (at::Tensor& s : sums_) s.zero_();
  total_weight_ = 0;
  contributions_ = 0;
}

}  // namespace diloco
