#include "worker/gradient_buckets.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <type_traits>

#include "worker/collective_group.h"
#include "worker/flat_adamw.h"

namespace diloco {

GradientBuckets::GradientBuckets(CollectiveGroup& group, FlatAdamW& optimizer, std::vector<torch::Tensor> params,
                                 int64_t bucket_elements, int rank, int size, double* collective_seconds)
    : group_(group),
      optimizer_(optimizer),
      params_(std::move(params)),
      rank_(rank),
      size_(size),
      collective_seconds_(collective_seconds) {
  int64_t offset = 0;
  for (const torch::Tensor& p : params_) {
    if (buckets_.empty() || buckets_.back().end - buckets_.back().begin >= bucket_elements) {
      buckets_.push_back(Bucket{offset, offset, 0, 0, {}});
    }
    offset_.push_back(offset);
    bucket_of_.push_back(static_cast<int>(buckets_.size()) - 1);
    offset += p.numel();
    buckets_.back().end = offset;
    ++buckets_.back().params;
  }
  if (offset != optimizer_.flat_parameters().numel()) {
    throw std::invalid_argument("GradientBuckets: the parameters are not the optimizer's");
  }
  next_ = static_cast<int>(buckets_.size()) - 1;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(params_[i]);
    accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          OnGradient(i);
          return outputs;
        }));
    accumulators_.push_back(std::make_shared<std::decay_t<decltype(accumulator)>>(std::move(accumulator)));
  }
}

GradientBuckets::~GradientBuckets() = default;

void GradientBuckets::OnGradient(size_t i) {
  torch::NoGradGuard no_grad;
  torch::Tensor& p = params_[i];
  Bucket& bucket = buckets_[static_cast<size_t>(bucket_of_[i])];
  if (!bucket.staging.defined()) bucket.staging = torch::zeros({bucket.end - bucket.begin}, p.options());
  if (p.grad().defined()) {
    bucket.staging.narrow(0, offset_[i] - bucket.begin, p.numel()).copy_(p.grad().reshape({-1}));
    p.mutable_grad().reset();  // the gradient's memory goes now, not at the next zeroing
  }
  ++bucket.ready;
  ReduceReady();
}

void GradientBuckets::ReduceReady() {
  while (next_ >= 0 && buckets_[static_cast<size_t>(next_)].ready == buckets_[static_cast<size_t>(next_)].params) {
    Reduce(buckets_[static_cast<size_t>(next_--)]);
  }
}

void GradientBuckets::Reduce(Bucket& bucket) {
  const int64_t slice = optimizer_.gradient_piece().numel();  // S: rank r owns flat [r S, (r + 1) S)
  if (!bucket.staging.defined()) bucket.staging = torch::zeros({bucket.end - bucket.begin}, torch::kFloat);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = static_cast<int>(bucket.begin / slice); r < size_ && r * slice < bucket.end; ++r) {
    const int64_t lo = std::max(bucket.begin, r * slice), hi = std::min(bucket.end, (r + 1) * slice);
    torch::Tensor part = bucket.staging.narrow(0, lo - bucket.begin, hi - lo);
    group_.ReduceSum(part, r);
    if (r == rank_) optimizer_.gradient_piece().narrow(0, lo - r * slice, hi - lo).copy_(part);
  }
  *collective_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bucket.staging = torch::Tensor();
  bucket.ready = 0;
}

void GradientBuckets::Flush() {
  torch::NoGradGuard no_grad;
  // A parameter without a gradient this backward leaves its bucket incomplete: it counts as zeros.
  for (; next_ >= 0; --next_) Reduce(buckets_[static_cast<size_t>(next_)]);
  next_ = static_cast<int>(buckets_.size()) - 1;
}

}  // namespace diloco
