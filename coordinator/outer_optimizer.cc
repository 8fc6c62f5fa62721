#include "coordinator/outer_optimizer.h"

#include <stdexcept>

namespace diloco {

OuterOptimizer::Kind OuterOptimizer::KindFromName(const std::string& name) {
  if (name == "nesterov") return Kind::kNesterov;
  if (name == "sgd") return Kind::kSgd;
  throw std::invalid_argument("unknown outer optimizer '" + name + "'");
}

OuterOptimizer::OuterOptimizer(Kind kind, double lr, double momentum)
    : kind_(kind), lr_(lr), momentum_(momentum) {}

std::vector<at::Tensor> OuterOptimizer::Step(const std::vector<at::Tensor>& theta,
                                             const std::vector<at::Tensor>& delta) {
  if (theta.size() != delta.size()) throw std::invalid_argument("OuterOptimizer::Step: tensor counts differ");
  if (!buffers_.empty() && buffers_.size() != theta.size()) {
    throw std::invalid_argument("OuterOptimizer::Step: momentum buffer count differs from the parameter count");
  }
  const bool first = buffers_.empty();
  std::vector<at::Tensor> next;
  next.reserve(theta.size());
  for (size_t i = 0; i < theta.size(); ++i) {
    at::Tensor update = delta[i];
    if (momentum_ != 0) {
      if (first) {
        buffers_.push_back(delta[i].clone());
      } else {
        buffers_[i] = buffers_[i].mul(momentum_).add_(delta[i]);  // new tensor: published buffers stay intact
      }
      update = kind_ == Kind::kNesterov ? delta[i].add(buffers_[i], momentum_) : buffers_[i];
    }
    next.push_back(theta[i].sub(update, lr_));
  }
  return next;
}

}  // namespace diloco
