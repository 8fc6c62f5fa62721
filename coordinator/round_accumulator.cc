#include "coordinator/round_accumulator.h"

#include <stdexcept>
#include <utility>

namespace diloco {

RoundAccumulator::RoundAccumulator(const std::vector<TensorSpec>& specs, bool per_coordinate) : count_(specs.size()) {
  for (const TensorSpec& s : specs) {
    sums_.push_back(at::zeros(s.shape, at::kFloat));
    if (per_coordinate) weights_.push_back(at::zeros(s.shape, at::kFloat));
  }
}

void RoundAccumulator::Fold(size_t index, int64_t offset, const at::Tensor& values, double weight,
                            double count_weight) {
  at::Tensor flat = sums_.at(index).view({-1});
  flat.narrow(0, offset, values.numel()).add_(values.to(at::kFloat), weight);
  if (weights_.empty()) return;
  weights_.at(index).view({-1}).narrow(0, offset, values.numel()).add_(count_weight < 0 ? weight : count_weight);
}

void RoundAccumulator::FoldSparse(size_t index, int64_t offset, const at::Tensor& positions, const at::Tensor& values,
                                  double weight, double count_weight) {
  float* sum = sums_.at(index).data_ptr<float>() + offset;
  const int64_t* p = positions.data_ptr<int64_t>();
  const float* v = values.data_ptr<float>();
  const auto w = static_cast<float>(weight);  // as Fold's add_ does: float32 arithmetic
  for (int64_t i = 0; i < values.numel(); ++i) sum[p[i]] += w * v[i];
  if (weights_.empty()) return;
  float* senders = weights_.at(index).data_ptr<float>() + offset;
  const auto c = static_cast<float>(count_weight < 0 ? weight : count_weight);
  for (int64_t i = 0; i < values.numel(); ++i) senders[p[i]] += c;
}

void RoundAccumulator::AddContribution(double weight) {
  total_weight_ += weight;
  ++contributions_;
}

std::vector<at::Tensor> RoundAccumulator::Average() const {
  if (total_weight_ <= 0) throw std::logic_error("RoundAccumulator::Average with no contribution");
  std::vector<at::Tensor> out;
  out.reserve(sums_.size());
  for (size_t i = 0; i < sums_.size(); ++i) {
    out.push_back(weights_.empty() ? sums_[i] / total_weight_
                                   : at::where(weights_[i] > 0, sums_[i] / weights_[i], at::zeros_like(sums_[i])));
  }
  return out;
}

std::vector<at::Tensor> RoundAccumulator::TakeAverage() {
  if (total_weight_ <= 0) throw std::logic_error("RoundAccumulator::TakeAverage with no contribution");
  if (weights_.empty()) {
    for (at::Tensor& s : sums_) s.div_(total_weight_);
  } else {  // SparseLoCo: each element over the weights of its senders; 0 where none sent it (its sum is 0)
    for (size_t i = 0; i < sums_.size(); ++i) {
      float* sum = sums_[i].data_ptr<float>();
      float* senders = weights_[i].data_ptr<float>();
      for (int64_t j = 0; j < sums_[i].numel(); ++j) {
        if (senders[j] > 0) sum[j] /= senders[j];
        senders[j] = 0;
      }
    }
  }
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
  for (at::Tensor& w : weights_) w.zero_();
  total_weight_ = 0;
  contributions_ = 0;
}

}  // namespace diloco
