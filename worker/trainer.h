// InnerTrainer: one worker's inner loop (DiLoCo Algorithm 1, lines 4-9). Each round it copies theta_t into its
// model, runs H = inner.steps AdamW steps on batches from its own shard (grad-norm clipping, warmup + cosine lr over
// the global inner step), and returns the pseudo-gradient delta = theta_t - theta_local. Streaming DiLoCo drives
// the same steps piecewise: TrainSteps, then PseudoGradient and Merge for one fragment's tensors.
// Batches come from the trainer's WindowSampler (data.sampling random or sequential, worker/data/window_sampler.h),
// whose state a restarted worker can restore. The AdamW state persists across rounds and is never sent. Shapes:
// parameters as in the LanguageModel of model.arch (worker/lm/language_model.h). With inner.micro_batch_size a step's
// batch is drawn as before (same windows, same order) and run through forward/backward in micro-batches whose
// gradients add up to the whole batch's; hooks, clipping and the AdamW step run once per step. Not thread-safe: one
// trainer per worker thread.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "proto/named_tensors.h"
#include "worker/data/token_data.h"
#include "worker/data/window_sampler.h"
#include "worker/flat_adamw.h"
#include "worker/lm/language_model.h"
#include "worker/round_result.h"

namespace diloco {

// Rank `rank` of `ranks`' slice of the inner step when config.workers.sharding is not none and ranks > 1 (slices
// aligned to comm.chunk_bytes / 4 elements, the wire's chunk); nullopt otherwise.
std::optional<FlatShard> ShardOf(const Config& config, int rank, int ranks);

class InnerTrainer {
 public:
  // Trains on `train`'s selected shard; `seed` seeds the sampler (data.sampling). `model`: the model to train (made
  // from config.model and run.seed when null; a caller that needed the model before it had the shard passes it).
  // `shard`: this rank's slice of a sharded cluster's inner step (ShardOf), none: the full AdamW state.
  InnerTrainer(const Config& config, TokenData train, torch::Device device, uint64_t seed,
               LanguageModelPtr model = nullptr, const std::optional<FlatShard>& shard = {});

  // The trainer of rank `rank` of a worker cluster of `cluster_size` (1: a plain worker) that reads shard
  // shard_index of shard_count of the training split of the token manifest at manifest_path: the rank reads its own
  // part of that shard (data.split decides how parts are cut) and samples with its own seed (run.seed and the part;
  // `shard_reader` > 0, JoinReply.shard_reader of a member that shares its shard, mixes in too: sharers draw
  // different windows). Errors name the manifest, the token file or the shard.
  static absl::StatusOr<std::unique_ptr<InnerTrainer>> ForShard(const Config& config, const std::string& manifest_path,
                                                                int shard_index, int shard_count, int rank,
                                                                int cluster_size, LanguageModelPtr model = nullptr,
                                                                const std::optional<FlatShard>& shard = {},
                                                                int shard_reader = 0);

  // The data position (worker/data/window_sampler.h): save it with the optimizer state, restore it after a restart to
  // continue the same stream of windows. RestoreSampler fails (and changes nothing) for a state that does not fit.
  SamplerState sampler_state() const;
  absl::Status RestoreSampler(const SamplerState& state);
  double epochs() const;  // epochs completed so far as a fraction (sequential), e.g. 1.25; random: windows
                          // drawn / windows in the shard
  // Called with each window drawn, in order, before its step runs (also for a step then abandoned).
  void set_window_observer(std::function<void(const WindowDraw&)> observer);

  // Zero-filled CPU tensors shaped like the parameters: the destination of a pull.
  NamedTensors MakeParameterBuffers() const;
  const LanguageModelPtr& model() const { return model_; }

  // Trains H inner steps starting from theta (theta_round); global inner steps start at round x H.
  // With load_theta false the model keeps its own parameters (outer.late_policy reuse_local) and the
  // pseudo-gradient is still theta - local. Returns early, nullopt (abandoned), once stop() says so (asked before
  // each step).
  using StopWish = std::function<bool()>;
  std::optional<RoundResult> TrainRound(const NamedTensors& theta, int64_t round, bool load_theta = true,
                                        const StopWish& stop = {});

  // The pieces TrainRound is made of. TrainSteps runs n steps, the first at global inner step first_step.
  StepStats TrainSteps(int64_t first_step, int64_t n, const StopWish& stop = {});
  // Copies theta (all parameters, in order) into the model.
  void Load(const NamedTensors& theta);
  // theta[j] - local[which[j]] for each j (theta holds the tensors at positions `which`), float32 on the CPU.
  // theta must be on the CPU (as pulled), whatever the model's device: else std::invalid_argument naming its device.
  NamedTensors PseudoGradient(const NamedTensors& theta, const std::vector<size_t>& which) const;
  // Streaming DiLoCo's merge: local[which[j]] <- alpha * local[which[j]] + (1 - alpha) * global[j].
  void Merge(const NamedTensors& global, const std::vector<size_t>& which, double alpha);

  // Worker clusters (worker/cluster.h). The gradient hook runs after each backward, before clipping, with the inner
  // optimizer's flat gradient buffer (all gradients, on the model's device; the hook may change it in place) and this
  // rank's wish to stop (stop()); it returns whether the cluster stops (then the step is not taken and TrainSteps
  // returns abandoned). With a gradient hook, stop() is only acted on through it, so all ranks stop at the same step.
  // The step hook runs after each optimizer step with the global step index.
  using GradientHook = std::function<bool(const torch::Tensor& flat_gradients, bool want_stop)>;
  using StepHook = std::function<void(const std::vector<torch::Tensor>& params, int64_t step)>;
  void set_gradient_hook(GradientHook hook) { gradient_hook_ = std::move(hook); }
  // Sharded clusters: the norm hook returns the squared L2 norm of the whole reduced gradient (one-element tensor on
  // the device; the ranks' slices summed), which clipping then uses instead of the optimizer's own gradient norm.
  using NormHook = std::function<torch::Tensor()>;
  void set_norm_hook(NormHook hook) { norm_hook_ = std::move(hook); }
  void set_step_hook(StepHook hook) { step_hook_ = std::move(hook); }
  // The inner AdamW (its moments and step count: the worker's local state, worker/worker_state.h).
  FlatAdamW& optimizer() { return *optimizer_; }
  const Config& config() const { return config_; }
  // TEST-ONLY (diloco-worker --attack nan-step:N or throw-step:N, worker/attack.h), at global inner step `step`, the
  // first time it is trained: kNan makes its loss NaN before its backward, so that the step's gradients (in a
  // cluster, through the averaging, every rank's), the parameters and the moments turn NaN, as a real divergence
  // would; kThrow throws std::runtime_error before its forward, as a device error (CUDA out of memory) would.
  enum class StepFault { kNone, kNan, kThrow };
  void set_step_fault(int64_t step, StepFault fault) {
    fault_step_ = step;
    fault_ = fault;
  }

 private:
  Batch NextBatch();  // batch_size windows from the sampler
  // Forward and backward of one step's batch, inner.micro_batch_size rows at a time (0: all at once), each under
  // workers.precision's autocast: leaves the gradient of the whole batch's mean loss in .grad (zeroed before) and
  // returns that loss as a 0-dim tensor on the device (no host sync).
  // poison: the loss is made NaN before the backward (set_step_fault kNan).
  torch::Tensor ForwardBackward(const Batch& batch, bool poison = false);
  // The AdamW step on the gradients in place, clipped to inner.grad_clip over the global norm.
  void ClippedStep(double lr);

  Config config_;
  TokenData train_;
  WindowSampler sampler_;
  std::function<void(const WindowDraw&)> window_observer_;
  torch::Device device_;
  LanguageModelPtr model_;
  std::unique_ptr<FlatAdamW> optimizer_;
  GradientHook gradient_hook_;
  NormHook norm_hook_;
  StepHook step_hook_;
  int64_t fault_step_ = -1;  // set_step_fault; -1: none
  StepFault fault_ = StepFault::kNone;
};

}  // namespace diloco
