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

namespace {
// candidates[i] if it exists, nobody else holds it and it has the right shape; else a new tensor like `like`.
// (Takes the list and an index rather than a tensor: any copy of the handle would raise its use_count.)
at::Tensor Reuse(const std::vector<at::Tensor>& candidates, size_t i, const at::Tensor& like) {
  if (i < candidates.size()) {
    const at::Tensor& c = candidates[i];
    if (c.defined() && c.use_count() == 1 && c.sizes() == like.sizes() && c.scalar_type() == like.scalar_type()) {
      return c;
    }
  }
  return at::empty_like(like);
}
}  // namespace

std::vector<at::Tensor> OuterOptimizer::Step(const std::vector<at::Tensor>& theta,
                                             const std::vector<at::Tensor>& delta, std::vector<at::Tensor> recycle) {
  if (theta.size() != delta.size()) throw std::invalid_argument("OuterOptimizer::Step: tensor counts differ");
  if (!buffers_.empty() && buffers_.size() != theta.size()) {
    throw std::invalid_argument("OuterOptimizer::Step: momentum buffer count differs from the parameter count");
  }
  const bool first = buffers_.empty();
  std::vector<at::Tensor> next(theta.size()), next_buffers(momentum_ != 0 ? theta.size() : 0);
  for (size_t i = 0; i < theta.size(); ++i) {
    // The same operations, in the same order, as torch.optim.SGD (so the results match it bit for bit), written
    // into reused memory: fresh 100 MB tensors every round would cost more in page faults than the arithmetic.
    at::Tensor out = Reuse(recycle, i, theta[i]);
    const at::Tensor* update = &delta[i];
    if (momentum_ != 0) {
      at::Tensor buf = Reuse(spare_buffers_, i, delta[i]);
      if (first) {
        buf.copy_(delta[i]);                       // buf = delta
      } else {
        at::mul_out(buf, buffers_[i], momentum_);  // buf = momentum * buf + delta
        buf.add_(delta[i]);
      }
      next_buffers[i] = buf;
      if (kind_ == Kind::kNesterov) {
        at::add_out(out, delta[i], buf, momentum_);  // delta + momentum * buf
        update = &out;
      } else {
        update = &next_buffers[i];
      }
    }
    at::add_out(out, theta[i], *update, -lr_);  // theta - lr * update
    next[i] = out;
  }
  if (momentum_ != 0) {
    spare_buffers_ = std::move(buffers_);  // reused next step unless someone (a checkpoint) still holds them
    buffers_ = std::move(next_buffers);
  }
  return next;
}

}  // namespace diloco
