#include "coordinator/delayed_nesterov.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace diloco {

DelayedNesterov::DelayedNesterov(double lr, double momentum, int64_t delay_n)
    : lr_(lr), momentum_(momentum), delay_n_(delay_n) {
  if (delay_n < 1) throw std::invalid_argument("DelayedNesterov: delay_n must be >= 1");
}

std::vector<at::Tensor> DelayedNesterov::Step(const std::vector<at::Tensor>& theta, const std::vector<at::Tensor>& g) {
  if (theta.size() != g.size()) throw std::invalid_argument("DelayedNesterov::Step: tensor counts differ");
  if (acc_.empty()) {
    for (const at::Tensor& t : theta) acc_.push_back(at::zeros_like(t));
  }
  if (m_.empty()) {
    for (const at::Tensor& t : theta) m_.push_back(at::zeros_like(t));
  }
  if (m_.size() != theta.size()) throw std::invalid_argument("DelayedNesterov: momentum count differs");
  const bool move = (arrivals_ + 1) % delay_n_ == 0;
  const double n = static_cast<double>(delay_n_);
  // Computed into new tensors and committed only when all are finite (the non-finite guard, outer_step.h): acc and
  // m as they would be, so a refused step leaves the state as it was (one transient copy of acc more).
  std::vector<at::Tensor> next(theta.size()), acc(theta.size()), m(theta.size());
  for (size_t i = 0; i < theta.size(); ++i) {
    if (theta[i].sizes() != g[i].sizes() || theta[i].scalar_type() != at::kFloat || g[i].scalar_type() != at::kFloat) {
      throw std::invalid_argument("DelayedNesterov::Step: tensors must be float32 of matching shapes");
    }
    acc[i] = acc_[i] + g[i];
    at::Tensor out = theta[i].clone();
    m[i] = m_[i];
    if (move) {
      m[i] = m_[i].mul(momentum_).add_(acc[i], 1.0 / n);  // a new tensor: a checkpoint may hold the old one
      out.add_(m[i], -lr_ * momentum_);
      acc[i].zero_();
    }
    out.add_(g[i], -lr_ / n);
    next[i] = out;
  }
  for (size_t i = 0; i < theta.size(); ++i) {
    if (!at::isfinite(next[i]).all().item<bool>() || !at::isfinite(acc[i]).all().item<bool>() ||
        (move && !at::isfinite(m[i]).all().item<bool>())) {
      throw NonFiniteStep("the Delayed Nesterov step's result of tensor " + std::to_string(i) +
                          " would not be finite; nothing committed");
    }
  }
  ++arrivals_;
  acc_ = std::move(acc);
  m_ = std::move(m);
  return next;
}

std::vector<at::Tensor> DelayedNesterov::Step(const std::vector<at::Tensor>& theta, const std::vector<at::Tensor>& g,
                                              std::vector<at::Tensor> /*recycle*/, const std::vector<size_t>* only) {
  if (only != nullptr) throw std::invalid_argument("DelayedNesterov::Step: steps the whole model (one fragment)");
  return Step(theta, g);
}

}  // namespace diloco
