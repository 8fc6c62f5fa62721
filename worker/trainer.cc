#include "worker/trainer.h"

#include <chrono>

#include "worker/lr_schedule.h"

namespace diloco {

InnerTrainer::InnerTrainer(const Config& config, TokenData train, torch::Device device, uint64_t seed)
    : config_(config),
      train_(std::move(train)),
      device_(device),
      model_(MakeTransformerLM(config.model, config.run.seed)),
      rng_(seed) {
  model_->to(device_);
  model_->train();
  optimizer_ = std::make_unique<torch::optim::AdamW>(
      model_->parameters(), torch::optim::AdamWOptions(config.inner.lr)
                                .betas({config.inner.beta1, config.inner.beta2})
                                .weight_decay(config.inner.weight_decay));
}

NamedTensors InnerTrainer::MakeParameterBuffers() const {
  NamedTensors out;
  for (const auto& [name, p] : NamedParameters(*model_)) {
    out.emplace_back(name, torch::zeros(p.sizes(), torch::kFloat));
  }
  return out;
}

RoundResult InnerTrainer::TrainRound(const NamedTensors& theta, int64_t round, bool load_theta,
                                     const std::atomic<bool>* stop) {
  const auto start = std::chrono::steady_clock::now();
  if (load_theta) LoadParameters(*model_, theta);
  const int64_t H = config_.inner.steps;
  const int64_t total_steps = config_.outer.rounds * H;
  const auto params = model_->parameters();
  RoundResult result;
  double loss_sum = 0;
  for (int64_t i = 0; i < H; ++i) {
    if (stop != nullptr && *stop) {
      result.abandoned = true;
      return result;
    }
    const double lr = InnerLearningRate(config_.inner, round * H + i, total_steps);
    for (auto& group : optimizer_->param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    Batch batch = train_.Sample(config_.inner.batch_size, rng_);
    optimizer_->zero_grad();
    torch::Tensor loss = model_->Loss(batch.inputs.to(device_), batch.targets.to(device_));
    loss.backward();
    if (config_.inner.grad_clip > 0) torch::nn::utils::clip_grad_norm_(params, config_.inner.grad_clip);
    optimizer_->step();
    const double l = loss.item<double>();
    if (i == 0) result.first_loss = l;
    loss_sum += l;
    result.last_lr = lr;
    result.tokens += batch.inputs.numel();
  }
  result.steps = H;
  result.mean_loss = loss_sum / static_cast<double>(H);
  {
    torch::NoGradGuard no_grad;
    const NamedTensors local = NamedParameters(*model_);
    for (size_t i = 0; i < theta.size(); ++i) {
      result.pseudo_gradient.emplace_back(theta[i].first, theta[i].second - local[i].second.to(torch::kCPU));
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace diloco
