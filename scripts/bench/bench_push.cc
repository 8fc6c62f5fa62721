// diloco-bench-push: a load generator for the coordinator's ingest path. It joins W workers (threads) to a running
// diloco-coordinator started with the same config, and for R rounds each one pulls theta and pushes a random
// pseudo-gradient with the config's codec, all W at once. Prints one JSON line: payload bytes pushed, the median
// seconds of the push phase (first push started to last push done) and the ingest throughput in MB/s. With
// comm.fragments > 1 (Streaming DiLoCo) each round's push carries fragment round mod P only.
// With --probe-ms N, one more thread, on a channel of its own, calls GetStatus and then Heartbeat (as worker push-0)
// every N ms and times each call; the calls started while pushes stream (between the first push's start and the last
// push's end of a round) give the p50/p99/max latencies in the JSON line, in milliseconds.
// Used by scripts/bench/comm; not a test. It trains nothing: the pushes carry random values of pseudo-gradient size.
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "config/config_loader.h"
#include "proto/codec.h"
#include "proto/diloco.grpc.pb.h"
#include "proto/fragment_plan.h"
#include "proto/tensor_spec.h"
#include "worker/client.h"
#include "worker/lm/language_model.h"

namespace {
using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Latencies (ms) of the probe's calls that started while pushes streamed.
struct ProbeSamples {
  std::vector<double> status_ms, heartbeat_ms;
  int errors = 0;
};

// Every period_ms until `stop`: one GetStatus and one Heartbeat (as `worker_id`, a member, so that the core does the
// heartbeat's real work), each timed; kept when `pushing` was set as the call started.
ProbeSamples Probe(const std::string& address, const std::string& worker_id, const std::string& fingerprint,
                   int period_ms, const std::atomic<bool>& pushing, const std::atomic<bool>& stop) {
  ProbeSamples out;
  auto stub = diloco::Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  diloco::HeartbeatRequest heartbeat;
  heartbeat.mutable_meta()->set_worker_id(worker_id);
  heartbeat.mutable_meta()->set_fingerprint(fingerprint);
  auto timed = [&](std::vector<double>* samples, auto call) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const bool during_push = pushing.load();
    const Clock::time_point start = Clock::now();
    const grpc::Status status = call(&ctx);
    const double ms = Since(start) * 1e3;
    if (!during_push) return;
    if (status.ok()) {
      samples->push_back(ms);
    } else {
      ++out.errors;
    }
  };
  while (!stop) {
    timed(&out.status_ms, [&](grpc::ClientContext* ctx) {
      diloco::StatusReply reply;
      return stub->GetStatus(ctx, diloco::StatusRequest(), &reply);
    });
    timed(&out.heartbeat_ms, [&](grpc::ClientContext* ctx) {
      diloco::HeartbeatReply reply;
      return stub->Heartbeat(ctx, heartbeat, &reply);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
  }
  return out;
}

// p in [0, 1], nearest rank; 0 for no samples.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::min(v.size(), std::max<size_t>(rank, 1)) - 1];
}

void AddLatencies(nlohmann::json& out, const std::string& name, const std::vector<double>& ms) {
  out[name + "_samples"] = ms.size();
  out[name + "_p50_ms"] = Percentile(ms, 0.5);
  out[name + "_p99_ms"] = Percentile(ms, 0.99);
  out[name + "_max_ms"] = Percentile(ms, 1.0);
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Push pseudo-gradients from W simulated workers to a running coordinator"};
  std::string config_path, address;
  std::vector<std::string> overrides;
  int workers = 2, rounds = 3, probe_ms = 0;
  app.add_option("--config", config_path)->required();
  app.add_option("--set", overrides);
  app.add_option("--coordinator", address)->required();
  app.add_option("--workers", workers);
  app.add_option("--rounds", rounds);
  app.add_option("--probe-ms", probe_ms, "time a GetStatus and a Heartbeat every this many ms during pushes (0: off)");
  CLI11_PARSE(app, argc, argv);
  auto config = diloco::LoadConfig(config_path, overrides);
  if (!config.ok()) {
    std::cerr << "error: " << config.status().message() << "\n";
    return 2;
  }
  diloco::LanguageModelPtr model = diloco::MakeLanguageModel(config->model, 0);
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
  std::atomic<bool> pushing{false}, stop_probe{false};
  Clock::time_point phase_start;
  std::barrier ready(workers, [&]() noexcept {
    phase_start = Clock::now();
    pushing = true;
  });
  std::barrier done(workers, [&]() noexcept {
    pushing = false;
    phase_seconds.push_back(Since(phase_start));
  });
  ProbeSamples probed;
  std::thread probe;
  if (probe_ms > 0) {
    probe = std::thread([&] { probed = Probe(address, "push-0", fingerprint, probe_ms, pushing, stop_probe); });
  }
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      diloco::CoordinatorClient client(address, "push-" + std::to_string(w), fingerprint, 120, config->comm.chunk_bytes,
                                       codec);
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
  stop_probe = true;
  if (probe.joinable()) probe.join();
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
  if (probe_ms > 0) {
    out["probe_ms"] = probe_ms;
    out["probe_errors"] = probed.errors;
    AddLatencies(out, "status", probed.status_ms);
    AddLatencies(out, "heartbeat", probed.heartbeat_ms);
  }
  std::cout << out.dump() << std::endl;
  return failed ? 1 : 0;
}
