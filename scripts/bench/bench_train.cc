// diloco-bench-train: measures, in one process, the worker's inner loop (tokens/s of InnerTrainer on the config's
// model, batch and data; on the CPU or, with --device cuda:N, a GPU), a matmul peak (1024^3 fp32 on the CPU, 8192^3
// bf16 on a GPU), the model FLOP utilisation against that peak (and against --peak-tflops), memory
// bandwidth (a triad), and the outer Nesterov step's time against its memory floor (5 x 4 bytes x params moved).
// Prints one JSON line. Used by scripts/bench/train; not a test.
// --composite-ops runs the model's attention as LibTorch's composite ops (as the Python reference
// does) instead of the fused kernels. With --profile-ops N it instead runs N inner steps under LibTorch's profiler
// and prints, per operator (matrix products also per shape), its self time per step and share of the total: where
// the C++ step's time goes. With --memory it instead prints what a training step holds in memory (the bytes LibTorch's
// CPU allocator holds at most above the level before the steps, from the profiler's memory events, and the process's
// peak RSS) beside tokens/s: one configuration per process, since peak RSS only grows (scripts/bench/memory).
#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "config/config_loader.h"
#include "config/data_cache.h"
#include "config/subprocess.h"
#include "coordinator/outer_optimizer.h"
#include "proto/compute_threads.h"
#include "worker/lm/kernel_dispatch.h"
#include "worker/lm/torch_compat.h"
#include "worker/trainer.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <typename F>
double MedianSeconds(int reps, F f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(Seconds(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Runs `steps` inner steps under the profiler; prints each operator's self time per step (its time less that of the
// operators it called), largest first.
void ProfileOps(diloco::InnerTrainer& trainer, int64_t steps) {
  using namespace torch::autograd::profiler;
  enableProfilerLegacy(ProfilerConfig(ProfilerState::CPU, /*report_input_shapes=*/true));
  trainer.TrainSteps(0, steps);
  const thread_event_lists lists = disableProfilerLegacy();
  std::map<std::string, double> self_us;
  std::map<std::string, int64_t> calls;
  for (const auto& list : lists) {
    std::vector<std::pair<const LegacyEvent*, double>> open;  // a started range and the time of its children
    for (const LegacyEvent& e : list) {
      if (e.kind() == EventKind::PushRange) {
        open.emplace_back(&e, 0.0);
      } else if (e.kind() == EventKind::PopRange && !open.empty()) {
        const auto [start, children_us] = open.back();
        open.pop_back();
        const double us = start->cpuElapsedUs(e);
        std::string key = start->name();
        if (key == "aten::mm") {
          for (const auto& shape : start->shapes()) {
            key += " [";
            for (size_t i = 0; i < shape.size(); ++i) key += (i ? "x" : "") + std::to_string(shape[i]);
            key += "]";
          }
        }
        self_us[key] += us - children_us;
        ++calls[key];
        if (!open.empty()) open.back().second += us;
      }
    }
  }
  double total = 0;
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [key, us] : self_us) {
    total += us;
    rows.emplace_back(us, key);
  }
  std::sort(rows.rbegin(), rows.rend());
  std::printf("%lld steps profiled: %.2f ms of operator time per step\n", static_cast<long long>(steps),
              total / steps / 1e3);
  std::printf("| operator | ms/step | share | calls/step |\n|---|---|---|---|\n");
  for (size_t i = 0; i < rows.size() && i < 25; ++i) {
    std::printf("| %s | %.3f | %.1f%% | %.0f |\n", rows[i].second.c_str(), rows[i].first / steps / 1e3,
                100 * rows[i].first / total, static_cast<double>(calls[rows[i].second]) / steps);
  }
}

// The most bytes LibTorch's CPU allocator held above its level at the start, over `steps` inner steps: every
// allocation and free the profiler saw, summed in order (activations, their gradients and temporaries; the
// parameters, gradients and AdamW moments live before the steps are the level).
int64_t PeakStepBytes(diloco::InnerTrainer& trainer, int64_t first_step, int64_t steps) {
  using namespace torch::autograd::profiler;
  enableProfilerLegacy(ProfilerConfig(ProfilerState::CPU, /*report_input_shapes=*/false, /*profile_memory=*/true));
  trainer.TrainSteps(first_step, steps);
  const thread_event_lists lists = disableProfilerLegacy();
  std::vector<std::pair<double, int64_t>> changes;  // (time in us, bytes: + allocated, - freed)
  for (const auto& list : lists) {
    for (const LegacyEvent& e : list) {
      if (e.kind() == EventKind::MemoryAlloc) changes.emplace_back(e.cpuUs(), e.cpuMemoryUsage());
    }
  }
  std::stable_sort(changes.begin(), changes.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  int64_t held = 0, peak = 0;
  for (const auto& [us, bytes] : changes) {
    held += bytes;
    peak = std::max(peak, held);
  }
  return peak;
}

double PeakRssMb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Benchmark the inner loop, matmul peak and outer step"};
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t steps = 100;
  int threads = 1;
  app.add_option("--config", config_path)->required();
  app.add_option("--set", overrides);
  app.add_option("--steps", steps, "inner steps timed (after one untimed round of the same length)");
  app.add_option("--threads", threads);
  int64_t profile_steps = 0;
  app.add_option("--profile-ops", profile_steps,
                 "instead of the benchmark: profile this many steps, print per operator");
  std::string device = "cpu";
  app.add_option("--device", device, "cpu or cuda:N: where the inner loop runs (the matmul peak is then bf16 there)");
  double peak_tflops = 0;
  app.add_option("--peak-tflops", peak_tflops, "also report MFU against this peak (e.g. the GPU's dense bf16 spec)");
  bool sdpa_on_cpu = false;
  app.add_flag("--sdpa-on-cpu", sdpa_on_cpu,
               "CPU float32 attention through at::scaled_dot_product_attention (LibTorch 2.x), not our fused kernel");
  bool composite_ops = false;
  app.add_flag("--composite-ops", composite_ops,
               "the model's attention as LibTorch's composite ops, not the fused kernel");
  bool memory = false;
  app.add_flag("--memory", memory,
               "instead of the benchmark: peak bytes of a step (LibTorch's CPU allocator) and peak RSS, with tokens/s");
  CLI11_PARSE(app, argc, argv);
  auto config = diloco::LoadConfig(config_path, overrides);
  if (!config.ok()) {
    std::cerr << "error: " << config.status().message() << "\n";
    return 2;
  }
  diloco::SetComputeThreads(threads);  // LibTorch and OpenBLAS, as the worker does
  diloco::AllowFusedKernels(!composite_ops);
  if (sdpa_on_cpu && !diloco::torch_compat::kHasSdpa) {
    std::cerr << "error: --sdpa-on-cpu needs the LibTorch 2.x build\n";
    return 2;
  }
  diloco::SetPreferSdpaOnCpu(sdpa_on_cpu);
  config->inner.steps = steps;
  auto cache = diloco::EnsureTokenized(*config, diloco::SiblingExecutable("diloco-tokenize"));
  if (!cache.ok()) {
    std::cerr << "error: " << cache.status().message() << "\n";
    return 2;
  }
  auto train = diloco::TokenData::Load(cache->meta_path(), diloco::TokenSplit::kTrain, config->model.seq_len);
  if (!train.ok()) {
    std::cerr << "error: " << train.status().message() << "\n";
    return 2;
  }
  const torch::Device on(device);
  if (on.is_cuda() && !torch::cuda::is_available()) {
    std::cerr << "error: --device " << device << ": no CUDA device here\n";
    return 2;
  }
  config->workers.device = device;
  diloco::InnerTrainer trainer(*config, std::move(*train), on, 1);
  // theta_t on the CPU, as the worker pulls it (InnerTrainer::PseudoGradient and the outer step refuse another device).
  diloco::NamedTensors theta;
  for (const auto& [name, p] : diloco::NamedParameters(*trainer.model())) {
    theta.emplace_back(name, p.detach().to(torch::kCPU, torch::kFloat, /*non_blocking=*/false, /*copy=*/true));
  }
  trainer.TrainRound(theta, 0);  // warm-up: allocations, AdamW state
  if (profile_steps > 0) {
    ProfileOps(trainer, profile_steps);
    return 0;
  }
  const diloco::RoundReport timed = trainer.TrainRound(theta, 1)->report;
  const double tokens_per_s = timed.tokens / timed.seconds;
  if (memory) {
    const int64_t peak_step_bytes = PeakStepBytes(trainer, 2 * steps, 2);
    nlohmann::json out = {{"impl", "c++ memory"},
                          {"batch_size", config->inner.batch_size},
                          {"micro_batch_size", config->inner.micro_batch_size},
                          {"activation_checkpointing", config->model.activation_checkpointing},
                          {"peak_step_mb", static_cast<double>(peak_step_bytes) / (1 << 20)},
                          {"peak_rss_mb", PeakRssMb()},
                          {"tokens_per_s", tokens_per_s}};
    std::cout << out.dump() << std::endl;
    return 0;
  }

  // Matmul peak: 1024^3 fp32 on the CPU; 8192^3 bf16 on a GPU (synchronised, so the time is the kernel's).
  const int64_t mm_n = on.is_cuda() ? 8192 : 1024;
  const auto mm_options = on.is_cuda() ? at::TensorOptions(at::kBFloat16).device(on) : at::TensorOptions(at::kFloat);
  const at::Tensor a = at::randn({mm_n, mm_n}, mm_options), b = at::randn({mm_n, mm_n}, mm_options);
  auto mm = [&] {
    at::mm(a, b);
    if (on.is_cuda()) torch::cuda::synchronize(on.index());
  };
  mm();
  const double mm_s = MedianSeconds(10, mm);
  const double peak_flops = 2.0 * mm_n * mm_n * mm_n / mm_s;

  // Training FLOPs per token: 6 x (block parameters) + 6 x layers x seq x d (attention scores and mixing)
  // + 6 x d x vocab (the tied output head).
  const auto& m = config->model;
  int64_t params = 0, embedding = m.vocab_size * m.d_model + m.seq_len * m.d_model;
  for (const auto& [name, t] : theta) params += t.numel();
  const double flops_per_token =
      6.0 * (params - embedding) + 6.0 * m.n_layer * m.seq_len * m.d_model + 6.0 * m.d_model * m.vocab_size;

  // Memory bandwidth: triad x = y + s * z over 3 x 256 MB.
  const int64_t n = 64 << 20;
  at::Tensor x = at::empty({n}), y = at::ones({n}), z = at::ones({n});
  at::add_out(x, y, z, 0.5);
  const double triad_s = MedianSeconds(5, [&] { at::add_out(x, y, z, 0.5); });
  const double bandwidth = 3.0 * 4 * n / triad_s;

  // Outer step on tensors shaped like the model (the second step, with momentum).
  diloco::OuterOptimizer outer(diloco::OuterOptimizer::Kind::kNesterov, 0.7, 0.9);
  std::vector<at::Tensor> th, delta;
  for (const auto& [name, t] : theta) {
    th.push_back(t.clone());
    delta.push_back(at::randn_like(t) * 1e-3);
  }
  outer.Step(th, delta);
  // As in the coordinator: theta_{t-2} is handed back for reuse once nothing holds it.
  std::vector<at::Tensor> previous;
  const double outer_s = MedianSeconds(20, [&] {
    std::vector<at::Tensor> next = outer.Step(th, delta, std::move(previous));
    previous = std::move(th);
    th = std::move(next);
  });
  const double outer_floor_s = 5.0 * 4 * params / bandwidth;

  nlohmann::json out = {{"impl", composite_ops ? "c++ composite"
                                 : sdpa_on_cpu ? "c++ sdpa"
                                               : "c++"},
                        {"torch", TORCH_VERSION},
                        {"device", device},
                        {"precision", config->workers.precision == diloco::Precision::kBf16 ? "bf16" : "fp32"},
                        {"final_loss", timed.mean_loss},
                        {"threads", threads},
                        {"params", params},
                        {"tokens_per_s", tokens_per_s},
                        {"seconds_per_step", timed.seconds / timed.steps},
                        {"matmul_gflops", peak_flops / 1e9},
                        {"flops_per_token", flops_per_token},
                        {"mfu", tokens_per_s * flops_per_token / peak_flops},
                        {"memory_gb_per_s", bandwidth / 1e9},
                        {"outer_step_ms", outer_s * 1e3},
                        {"outer_floor_ms", outer_floor_s * 1e3},
                        {"outer_vs_floor", outer_s / outer_floor_s}};
  if (peak_tflops > 0) out["mfu_vs_given_peak"] = tokens_per_s * flops_per_token / (peak_tflops * 1e12);
  std::cout << out.dump() << std::endl;
  return 0;
}
