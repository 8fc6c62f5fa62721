// diloco-bench-push: a load generator for the coordinator's ingest path. It joins W workers (threads) to a running
// diloco-coordinator started with the same config, and for R rounds each one pulls theta and pushes a random
// pseudo-gradient with the config's codec, all W at once. Prints one JSON line: payload bytes pushed, the median
// seconds of the push phase (first push started to last push done) and the ingest throughput in MB/s. With
// comm.fragments > 1 (Streaming DiLoCo) each round's push carries fragment round mod P only.
// Used by scripts/bench/comm; not a test. It trains nothing: the pushes carry random values of pseudo-gradient size.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "config/config_loader.h"
#include "proto/codec.h"
#include "proto/tensor_spec.h"
#include "worker/client.h"
#include "proto/fragment_plan.h"
#include "worker/lm/transformer.h"

namespace {
using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Push pseudo-gradients from W simulated workers to a running coordinator"};
  std::string config_path, address;
  std::vector<std::string> overrides;
  int workers = 2, rounds = 3;
  app.add_option("--config", config_path)->required();
  app.add_option("--set", overrides);
  app.add_option("--coordinator", address)->required();
  app.add_option("--workers", workers);
  app.add_option("--rounds", rounds);
  CLI11_PARSE(app, argc, argv);
  auto config = diloco::LoadConfig(config_path, overrides);
  if (!config.ok()) {
    std::cerr << "error: " << config.status().message() << "\n";
    return 2;
  }
  diloco::TransformerLM model = diloco::MakeTransformerLM(config->model, 0);
  const auto params = diloco::NamedParameters(*model);
  const std::string fingerprint = diloco::Fingerprint(diloco::SpecsOf(params));
  const diloco::Codec codec = diloco::CodecOf(config->comm.codec);
  diloco::ModelSpec spec;
  spec.set_vocab_size(config->model.vocab_size);
  spec.set_seq_len(config->model.seq_len);
  spec.set_n_layer(config->model.n_layer);
  spec.set_n_head(config->model.n_head);
  spec.set_d_model(config->model.d_model);

  std::vector<double> phase_seconds;
  std::atomic<int64_t> bytes{0};
  std::atomic<bool> failed{false};
  Clock::time_point phase_start;
  std::barrier ready(workers, [&]() noexcept { phase_start = Clock::now(); });
  std::barrier done(workers, [&]() noexcept { phase_seconds.push_back(Since(phase_start)); });
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      diloco::CoordinatorClient client(address, "push-" + std::to_string(w), fingerprint, 120,
                                       config->comm.chunk_bytes, codec);
      const int P = static_cast<int>(config->comm.fragments);
      if (!client.Join(spec, 1, "cpu", -1, P).ok()) failed = true;
      std::vector<std::string> names;
      for (const auto& [name, p] : params) names.push_back(name);
      const diloco::FragmentPlan plan(names, P);
      std::vector<diloco::RoundResult> results(static_cast<size_t>(P));  // one per fragment
      for (int f = 0; f < P; ++f) {
        diloco::RoundResult& result = results[static_cast<size_t>(f)];
        result.fragment = f;
        result.tokens = 1000;
        result.steps = config->StepsPerSync();
        result.seconds = 1;
        for (size_t i : plan.members(static_cast<int>(f))) {
          result.pseudo_gradient.emplace_back(params[i].first, torch::randn_like(params[i].second) * 1e-3);
        }
      }
      diloco::NamedTensors theta;
      for (const auto& [name, p] : params) theta.emplace_back(name, torch::zeros_like(p).detach());
      int64_t last_round = -1;
      for (int r = 0; r < rounds; ++r) {
        auto pulled = client.Pull(theta);
        while (pulled.ok() && pulled->round == last_round) {  // wait for the previous round to close
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          pulled = client.Pull(theta);
        }
        if (!pulled.ok()) failed = true;
        last_round = pulled.ok() ? pulled->round : last_round;
        ready.arrive_and_wait();
        auto pushed = client.Push(last_round, results[static_cast<size_t>(last_round % P)]);
        if (pushed.ok()) {
          bytes += *pushed;
        } else {
          std::cerr << "push failed: " << pushed.status() << "\n";
          failed = true;
        }
        done.arrive_and_wait();
      }
      (void)client.Leave("benchmark done");
    });
  }
  for (auto& t : threads) t.join();
  std::sort(phase_seconds.begin(), phase_seconds.end());
  const double median = phase_seconds[phase_seconds.size() / 2];
  const double per_round = static_cast<double>(bytes) / rounds;
  nlohmann::json out = {{"workers", workers},
                        {"rounds", rounds},
                        {"codec", std::string(diloco::EnumName(config->comm.codec))},
                        {"fragments", config->comm.fragments},
                        {"transport", std::string(diloco::EnumName(config->comm.transport))},
                        {"params", diloco::TotalElements(diloco::SpecsOf(params))},
                        {"bytes_per_round", per_round},
                        {"bytes_per_round_per_worker", per_round / workers},
                        {"push_phase_s", median},
                        {"ingest_mb_per_s", per_round / median / 1e6},
                        {"ok", !failed}};
  std::cout << out.dump() << std::endl;
  return failed ? 1 : 0;
}
