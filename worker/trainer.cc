#include "worker/trainer.h"

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "absl/strings/str_cat.h"
#include "worker/data/keyed_permutation.h"
#include "worker/lm/torch_compat.h"
#include "worker/lr_schedule.h"

namespace diloco {
namespace {

// workers.precision bf16: the forward pass of one step runs under autocast (matmuls in bfloat16, reductions and the
// loss in float32; parameters, gradients and AdamW stay float32). Autocast state is thread-local; restored on exit.
class AutocastScope {
 public:
  AutocastScope(bool on, const torch::Device& device) : on_(on), type_(device.type()) {
    if (!on_) return;
    was_enabled_ = torch_compat::AutocastEnabled(type_);
    was_dtype_ = torch_compat::AutocastDtype(type_);
    torch_compat::SetAutocast(type_, true, at::kBFloat16);
  }
  ~AutocastScope() {
    if (!on_) return;
    torch_compat::SetAutocast(type_, was_enabled_, was_dtype_);
    at::autocast::clear_cache();
  }

 private:
  bool on_;
  at::DeviceType type_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

}  // namespace

std::optional<FlatShard> ShardOf(const Config& config, int rank, int ranks) {
  if (config.workers.sharding == Sharding::kNone || ranks < 2) return std::nullopt;
  const bool gradients = config.workers.sharding == Sharding::kGradients;
  // Gradients reduced bucket by bucket during backward (worker/gradient_buckets.h): on the CPU (Gloo), and when one
  // backward makes the step's gradient (no micro-batches accumulating into it).
  const int64_t micro = config.inner.micro_batch_size;
  const bool bucketed =
      gradients && torch::Device(config.workers.device).is_cpu() && (micro <= 0 || micro >= config.inner.batch_size);
  return FlatShard{rank, ranks, std::max<int64_t>(1, config.comm.chunk_bytes / 4), gradients, bucketed};
}

InnerTrainer::InnerTrainer(const Config& config, TokenData train, torch::Device device, uint64_t seed,
                           LanguageModelPtr model, const std::optional<FlatShard>& shard)
    : config_(config),
      train_(std::move(train)),
      sampler_(config.data.sampling, train_.layout(), seed),
      device_(device),
      model_(model ? std::move(model) : MakeLanguageModel(config.model, config.run.seed)) {
  model_->to(device_);
  model_->train();
  AdamWSettings adamw;
  adamw.beta1 = config.inner.beta1;
  adamw.beta2 = config.inner.beta2;
  adamw.weight_decay = config.inner.weight_decay;
  adamw.decay_1d = config.inner.weight_decay_1d;
  optimizer_ = std::make_unique<FlatAdamW>(model_->parameters(), adamw, shard);
}

absl::StatusOr<std::unique_ptr<InnerTrainer>> InnerTrainer::ForShard(
    const Config& config, const std::string& manifest_path, int shard_index, int shard_count, int rank,
    int cluster_size, LanguageModelPtr model, const std::optional<FlatShard>& shard, int shard_reader) {
  auto train = TokenData::Load(manifest_path, TokenSplit::kTrain, config.model.seq_len);
  if (!train.ok()) return train.status();
  // The rank's part of the worker's shard (MakeRankLayout); `part` numbers it among every rank of every worker of
  // this cluster size (with one rank: the worker's shard itself), for its sampler's seed.
  absl::Status s =
      train->SelectRankShard(shard_index, shard_count, rank, cluster_size, config.data.split == DataSplit::kContiguous);
  if (!s.ok()) return s;
  const int part = shard_index + shard_count * rank;
  uint64_t seed = static_cast<uint64_t>(config.run.seed) * 1000003ULL + static_cast<uint64_t>(part) + 1;
  if (shard_reader > 0) seed = Mix64(seed ^ Mix64(static_cast<uint64_t>(shard_reader)));
  return std::make_unique<InnerTrainer>(config, std::move(*train), torch::Device(config.workers.device), seed,
                                        std::move(model), shard);
}

SamplerState InnerTrainer::sampler_state() const { return sampler_.state(); }

absl::Status InnerTrainer::RestoreSampler(const SamplerState& state) {
  WindowSampler restored = sampler_;
  absl::Status s = restored.Restore(state);
  if (s.ok()) sampler_ = std::move(restored);
  return s;
}

double InnerTrainer::epochs() const { return sampler_.epochs(); }

void InnerTrainer::set_window_observer(std::function<void(const WindowDraw&)> observer) {
  window_observer_ = std::move(observer);
}

Batch InnerTrainer::NextBatch() {
  std::vector<int64_t> starts(static_cast<size_t>(config_.inner.batch_size));
  for (int64_t& start : starts) {
    const WindowDraw draw = sampler_.Next();
    if (window_observer_) window_observer_(draw);
    start = draw.start;
  }
  return train_.Gather(starts);
}

NamedTensors InnerTrainer::MakeParameterBuffers() const {
  NamedTensors out;
  for (const auto& [name, p] : NamedParameters(*model_)) {
    out.emplace_back(name, torch::zeros(p.sizes(), torch::kFloat));
  }
  return out;
}

void InnerTrainer::Load(const NamedTensors& theta) { LoadParameters(*model_, theta); }

torch::Tensor InnerTrainer::ForwardBackward(const Batch& batch, bool poison) {
  // On a GPU the batch goes through pinned host memory and is copied without waiting: the inner step has no host
  // sync, so the host draws and copies batch i + 1 while the GPU still runs step i. On the CPU .to() is a no-op.
  auto to_device = [&](const torch::Tensor& t) {
    return device_.is_cuda() ? t.pin_memory().to(device_, /*non_blocking=*/true) : t.to(device_);
  };
  const torch::Tensor inputs = to_device(batch.inputs), targets = to_device(batch.targets);
  const int64_t rows = inputs.size(0);
  const int64_t micro = config_.inner.micro_batch_size > 0 ? config_.inner.micro_batch_size : rows;
  torch::Tensor total;
  for (int64_t begin = 0; begin < rows; begin += micro) {
    const int64_t n = std::min(micro, rows - begin);
    torch::Tensor loss;
    {
      AutocastScope autocast(config_.workers.precision == Precision::kBf16, device_);
      loss = model_->Loss(inputs.narrow(0, begin, n), targets.narrow(0, begin, n));
    }
    // Every row has T tokens, so the batch's mean loss is the sum of the micro-batches' means times n / rows.
    if (n != rows) loss = loss * (static_cast<double>(n) / static_cast<double>(rows));
    if (poison) loss = loss * std::numeric_limits<double>::quiet_NaN();
    loss.backward();  // adds into .grad (FlatAdamW's flat views, in place)
    total = total.defined() ? total + loss.detach() : loss.detach();
  }
  return total;
}

void InnerTrainer::ClippedStep(double lr) {
  // Clipping as torch::nn::utils::clip_grad_norm_ does it, its scale folded into the step: on the CPU a double
  // (one read of the norm), on a GPU a one-element tensor computed there and handed to the fused AdamW kernel.
  // A sharded cluster's norm is the sum of its ranks' squared slice norms (the norm hook).
  const double clip = config_.inner.grad_clip;
  if (device_.is_cpu()) {
    double grad_scale = 1.0;
    if (clip > 0) {
      const double norm = norm_hook_ ? std::sqrt(norm_hook_().item<double>()) : optimizer_->GradNorm();
      grad_scale = std::min(1.0, clip / (norm + 1e-6));
    }
    optimizer_->Step(lr, grad_scale);
  } else if (clip > 0 && norm_hook_) {
    torch::NoGradGuard no_grad;
    optimizer_->Step(lr, (clip / (norm_hook_().sqrt() + 1e-6)).clamp_max(1.0).reshape({1}));
  } else {
    optimizer_->Step(lr, clip > 0 ? optimizer_->ClipScale(clip) : torch::Tensor());
  }
}

StepStats InnerTrainer::TrainSteps(int64_t first_step, int64_t n, const StopWish& stop) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t total_steps = config_.outer.rounds * config_.inner.steps;
  const auto params = model_->parameters();
  StepStats stats;
  std::vector<torch::Tensor> losses;  // on the device; read once, after the steps (no host sync per step on a GPU)
  for (int64_t i = 0; i < n; ++i) {
    const auto step_start = std::chrono::steady_clock::now();
    const bool want_stop = stop && stop();
    if (want_stop && !gradient_hook_) {
      stats.abandoned = true;
      break;
    }
    const double lr = InnerLearningRate(config_.inner, first_step + i, total_steps);
    Batch batch = NextBatch();
    optimizer_->ZeroGrad();
    const bool faulty = first_step + i == fault_step_;
    if (faulty) fault_step_ = -1;  // once: the round is trained again from the same step
    if (faulty && fault_ == StepFault::kThrow) {
      throw std::runtime_error(absl::StrCat("test-only --attack throw-step: inner step ", first_step + i,
                                            " failed (as a device error would)"));
    }
    const bool poison = faulty && fault_ == StepFault::kNan;
    const torch::Tensor loss = ForwardBackward(batch, poison);
    if (gradient_hook_ && gradient_hook_(optimizer_->flat_gradients(), want_stop)) {
      stats.abandoned = true;
      break;
    }
    ClippedStep(lr);
    if (step_hook_) step_hook_(params, first_step + i);
    losses.push_back(loss);
    stats.last_lr = lr;
    stats.tokens += batch.inputs.numel();
    ++stats.steps;
    if (config_.workers.slowdown > 1) {  // a slower device, for heterogeneity tests: the step takes slowdown x as long
      std::this_thread::sleep_for((std::chrono::steady_clock::now() - step_start) * (config_.workers.slowdown - 1));
    }
  }
  if (!losses.empty()) {
    const torch::Tensor values = torch::stack(losses).to(torch::kCPU, torch::kDouble);
    const auto v = values.accessor<double, 1>();
    stats.first_loss = v[0];
    for (int64_t j = 0; j < v.size(0); ++j) stats.loss_sum += v[j];
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

NamedTensors InnerTrainer::PseudoGradient(const NamedTensors& theta, const std::vector<size_t>& which) const {
  torch::NoGradGuard no_grad;
  const NamedTensors local = NamedParameters(*model_);
  for (size_t j = 0; j < which.size(); ++j) {
    if (!theta[j].second.device().is_cpu()) {  // theta is pulled to the CPU; the model's copy may be elsewhere
      throw std::invalid_argument("InnerTrainer::PseudoGradient: theta tensor '" + theta[j].first + "' is on " +
                                  theta[j].second.device().str() + "; theta_t is kept on the CPU (the model on " +
                                  device_.str() + " holds the local copy)");
    }
  }
  // On a GPU every selected tensor is queued for copying into pinned host memory without waiting, then one
  // synchronisation: one stream of device-to-host copies at pinned speed instead of a blocking pageable copy per
  // tensor. On the CPU the local tensors are used as they are.
  std::vector<torch::Tensor> on_host;
  for (size_t i : which) {
    const torch::Tensor& p = local.at(i).second;
    if (!device_.is_cuda()) {
      on_host.push_back(p);
      continue;
    }
    on_host.push_back(torch::empty(p.sizes(), torch::TensorOptions(p.dtype()).pinned_memory(true)));
    on_host.back().copy_(p, /*non_blocking=*/true);
  }
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
  NamedTensors out;
  for (size_t j = 0; j < which.size(); ++j) out.emplace_back(theta[j].first, theta[j].second - on_host[j]);
  return out;
}

void InnerTrainer::Merge(const NamedTensors& global, const std::vector<size_t>& which, double alpha) {
  torch::NoGradGuard no_grad;
  const NamedTensors local = NamedParameters(*model_);
  for (size_t j = 0; j < which.size(); ++j) {
    torch::Tensor p = local.at(which[j]).second;
    p.mul_(alpha).add_(global[j].second.to(p.device()), 1.0 - alpha);
  }
}

std::optional<RoundResult> InnerTrainer::TrainRound(const NamedTensors& theta, int64_t round, bool load_theta,
                                                    const StopWish& stop) {
  if (load_theta) Load(theta);
  const int64_t H = config_.inner.steps;
  const StepStats stats = TrainSteps(round * H, H, stop);
  if (stats.abandoned) return std::nullopt;
  const auto start = std::chrono::steady_clock::now();
  std::vector<size_t> all(theta.size());
  std::iota(all.begin(), all.end(), size_t{0});
  RoundResult result{PseudoGradient(theta, all), ReportRound(stats, 0, 1, epochs())};
  result.report.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace diloco
