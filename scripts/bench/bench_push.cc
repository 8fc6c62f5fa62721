// diloco-bench-push: a load generator for the coordinator's ingest and pull paths. It joins W workers (threads) to a
// running diloco-coordinator started with the same config, and for R rounds: all W pull theta at once (the pull
// phase: first pull started to last pull done), then all W push a pseudo-gradient with the config's codec at once
// (the push phase), then worker 0 polls GetStatus until the coordinator has closed the round and reads its
// last_outer_step_seconds. Prints one JSON line: payload bytes pushed, the median push phase and the ingest throughput
// in MB/s; bytes pulled per round and the pull fan-out in MB/s (bytes pulled by all W / pull phase, median over
// rounds); the coordinator's outer step seconds of every round (outer_step_s), the first and the median.
// Each worker also heartbeats every coordinator.heartbeat_interval_s, as a real one does (one thread for all W).
// With comm.fragments > 1 (Streaming DiLoCo) each round's push carries fragment round mod P only.
// With --probe-ms N, one more thread, on a channel of its own, calls GetStatus and then Heartbeat (as worker push-0)
// every N ms and times each call; the calls started while pushes stream (between the first push's start and the last
// push's end of a round) give the p50/p99/max latencies in the JSON line, in milliseconds.
// Memory: about ONE copy of the model in all, whatever W, so that 8 workers of a 1B-parameter model fit beside the
// coordinator: the model is built once (for the parameter names, shapes and the fingerprint), its parameters are then
// overwritten in place with N(0, 1e-3) values and are the read-only pseudo-gradient every worker pushes; pulls are read
// off the stream and dropped (bytes and elements counted, nothing decoded), so a worker holds one chunk, not a model.
// --distinct-noise S gives each worker its own values instead (the shared ones + N(0, S): one copy of the model per
// worker).
// Used by scripts/bench/comm and tests/integration/coordinator_memory_test.cc; not a test. It trains nothing.
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

#include "absl/strings/str_cat.h"
#include "config/config_loader.h"
#include "config/message_limit.h"
#include "proto/codec.h"
#include "proto/diloco.grpc.pb.h"
#include "proto/fragment_plan.h"
#include "proto/grpc_status.h"
#include "proto/tensor_spec.h"
#include "worker/client.h"
#include "worker/lm/language_model.h"
#include "worker/round_result.h"

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

// The middle value (the mean of the two middle ones for an even count); 0 for none.
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::unique_ptr<diloco::Coordinator::Stub> NewStub(const std::string& address, int64_t chunk_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(diloco::MaxMessageBytes(chunk_bytes)));
  return diloco::Coordinator::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

std::chrono::system_clock::time_point Deadline(double seconds) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

struct Pulled {
  int64_t round = -1;
  int64_t bytes = 0;  // chunk payload bytes, as the coordinator encoded them (comm.pull_codec)
};

// One PullParameters stream read to its end (as worker `worker_id`); the chunks are counted and dropped, nothing is
// decoded. DATA_LOSS if the chunks do not add up to the header's element count.
absl::StatusOr<Pulled> PullAndDiscard(diloco::Coordinator::Stub& stub, const std::string& worker_id,
                                      const std::string& fingerprint, double timeout_s) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(timeout_s));
  diloco::PullRequest request;
  request.mutable_meta()->set_worker_id(worker_id);
  request.mutable_meta()->set_fingerprint(fingerprint);
  std::unique_ptr<grpc::ClientReader<diloco::PullMessage>> reader = stub.PullParameters(&ctx, request);
  diloco::PullMessage message;
  Pulled out;
  int64_t elements = 0, expected = -1;
  while (reader->Read(&message)) {
    if (message.has_header()) {
      out.round = message.header().round();
      expected = message.header().num_elements();
    } else {
      out.bytes += static_cast<int64_t>(message.chunk().data().size());
      elements += message.chunk().count();
    }
  }
  if (absl::Status s = diloco::FromGrpc(reader->Finish()); !s.ok()) return s;
  if (expected < 0 || elements != expected) {
    return absl::DataLossError(absl::StrCat("pull: ", elements, " elements of ", expected));
  }
  return out;
}

// Polls GetStatus every 20 ms until the coordinator has completed more than `round` outer steps; returns its
// last_outer_step_seconds then (the step that closed `round`: the next one needs our pushes). DEADLINE_EXCEEDED after
// timeout_s.
absl::StatusOr<double> WaitForClose(diloco::Coordinator::Stub& stub, int64_t round, double timeout_s) {
  const Clock::time_point start = Clock::now();
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(30));
    diloco::StatusReply reply;
    if (absl::Status s = diloco::FromGrpc(stub.GetStatus(&ctx, diloco::StatusRequest(), &reply)); !s.ok()) return s;
    if (reply.round() > round) return reply.last_outer_step_seconds();
    if (Since(start) > timeout_s) {
      return absl::DeadlineExceededError(absl::StrCat("round ", round + 1, " not closed after ", timeout_s, " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The pseudo-gradient of each fragment (one per fragment; P = 1 without fragments), made of the model's own parameter
// tensors overwritten in place with N(0, 1e-3): no copy of the model. Shared read-only by every worker's push.
std::vector<diloco::RoundResult> SharedPseudoGradients(const diloco::NamedTensors& params,
                                                       const diloco::Config& config) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : params) p.normal_(0, 1e-3);
  std::vector<std::string> names;
  for (const auto& [name, p] : params) names.push_back(name);
  const int P = static_cast<int>(config.comm.fragments);
  const diloco::FragmentPlan plan(names, P);
  std::vector<diloco::RoundResult> results(static_cast<size_t>(P));
  for (int f = 0; f < P; ++f) {
    diloco::RoundResult& result = results[static_cast<size_t>(f)];
    result.report.fragment = f;
    result.report.tokens = 1000;
    result.report.steps = config.StepsPerSync();
    result.report.seconds = 1;
    for (size_t i : plan.members(f)) result.pseudo_gradient.emplace_back(params[i].first, params[i].second.detach());
    double squares = 0;  // the claimed norm (PushHeader.claimed_norm), for outer.aggregation clip; exact for fp32
    for (const auto& [name, d] : result.pseudo_gradient) squares += d.to(at::kDouble).square().sum().item<double>();
    result.report.norm = std::sqrt(squares);
  }
  return results;
}

// Worker w's own pushes: the shared tensors, except for the first element of each fragment's smallest tensor, which
// is made different for every worker and round (MarkPush): the robust rules refuse a push byte-identical to another
// of the round or of the previous round (a copy or a replay), so identical simulated pushes would all be refused.
// One cloned small tensor (a norm's gains) per fragment and worker; the claimed norm moves by far less than the
// coordinator's tolerance.
size_t SmallestTensor(const diloco::RoundResult& result) {
  size_t best = 0;
  for (size_t i = 1; i < result.pseudo_gradient.size(); ++i) {
    if (result.pseudo_gradient[i].second.numel() < result.pseudo_gradient[best].second.numel()) best = i;
  }
  return best;
}
// noise > 0 (--distinct-noise): every tensor gets the worker's own N(0, noise) added (a copy of the model per worker),
// so each coordinate's values differ across the pushes as real workers' do; the coordinate-wise rules' sort of a
// column of equal values is not the work real pushes make.
std::vector<diloco::RoundResult> OwnPushes(const std::vector<diloco::RoundResult>& shared, double noise) {
  std::vector<diloco::RoundResult> own = shared;  // tensor handles: the data stays shared
  for (diloco::RoundResult& result : own) {
    if (result.pseudo_gradient.empty()) continue;
    if (noise > 0) {
      double squares = 0;  // its own claimed norm
      for (auto& [name, t] : result.pseudo_gradient) {
        t = t + at::randn_like(t) * noise;
        squares += t.to(at::kDouble).square().sum().item<double>();
      }
      result.report.norm = std::sqrt(squares);
      continue;
    }
    at::Tensor& t = result.pseudo_gradient[SmallestTensor(result)].second;
    t = t.clone();
  }
  return own;
}
void MarkPush(diloco::RoundResult& result, int worker, int64_t round, const diloco::RoundResult& shared) {
  if (result.pseudo_gradient.empty()) return;
  const size_t i = SmallestTensor(shared);
  const float base = shared.pseudo_gradient[i].second.view({-1})[0].item<float>();
  result.pseudo_gradient[i].second.view({-1})[0] = base + 1e-7f * static_cast<float>(1 + worker + 1000 * round);
}

// Push, retried while the coordinator answers UNAVAILABLE or ABORTED (as a worker does, worker/protocol_decision.h):
// the robust rules hold a round's early pushers back with UNAVAILABLE until the round's set is known
// (outer.aggregation clip: every member's header has declared its norm; trimmed_mean and centered_clip: the set of
// pushes is fixed), so in the push phase all but the last pusher may be told to come back; ABORTED says another
// push broke off and the round's aggregation restarted. Retries every 20 ms (short against a push phase) for up to
// timeout_s; the push phase includes the waits.
absl::StatusOr<int64_t> PushRetryingUnavailable(diloco::CoordinatorClient& client, int64_t round,
                                                const diloco::RoundResult& result, double timeout_s) {
  const Clock::time_point start = Clock::now();
  absl::StatusOr<int64_t> sent = client.Push(round, result);
  while (!sent.ok() && (absl::IsUnavailable(sent.status()) || absl::IsAborted(sent.status())) &&
         Since(start) < timeout_s) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    sent = client.Push(round, result);
  }
  return sent;
}

// A barrier's completion step (std::barrier takes one nothrow callable type).
struct PhaseStep {
  std::function<void()> run;
  void operator()() noexcept { run(); }
};

// What the W worker threads share. Barrier completions and worker 0 write the per-round lists; the counters are atomic.
struct Bench {
  Bench(const diloco::Config& config_in, std::string address_in, std::string fingerprint_in, int workers_in,
        int rounds_in)
      : config(config_in),
        address(std::move(address_in)),
        fingerprint(std::move(fingerprint_in)),
        workers(workers_in),
        rounds(rounds_in),
        pull_ready(workers, PhaseStep{[this]() noexcept { pull_start = Clock::now(); }}),
        pull_done(workers, PhaseStep{[this]() noexcept {
                    const double s = Since(pull_start);
                    pull_seconds.push_back(s);
                    pull_rates.push_back(static_cast<double>(round_pulled.exchange(0)) / s / 1e6);
                  }}),
        push_ready(workers, PhaseStep{[this]() noexcept {
                     push_start = Clock::now();
                     pushing = true;
                   }}),
        push_done(workers, PhaseStep{[this]() noexcept {
                    pushing = false;
                    push_seconds.push_back(Since(push_start));
                  }}),
        closed(workers) {}

  void Worker(int w, const diloco::ModelSpec& spec, const std::vector<diloco::RoundResult>& results);
  double distinct_noise = 0;  // --distinct-noise (OwnPushes)
  // Every coordinator.heartbeat_interval_s until `stop`: a Heartbeat from each worker (errors ignored: before its
  // Join, after its Leave), as real workers do, so that no lease (coordinator.lease_s) runs out while a big model's
  // pulls, outer step or checkpoint take long.
  void Heartbeats(const std::atomic<bool>& stop);
  double RpcTimeout() const { return std::max(120.0, 2 * config.coordinator.round_timeout_s); }

  const diloco::Config& config;
  const std::string address, fingerprint;
  const int workers, rounds;
  std::atomic<int64_t> pushed{0}, pulled{0}, round_pulled{0};
  std::atomic<bool> failed{false}, pushing{false};
  Clock::time_point pull_start, push_start;
  std::vector<double> pull_seconds, pull_rates, push_seconds, outer_step_seconds;
  std::barrier<PhaseStep> pull_ready, pull_done, push_ready, push_done;
  std::barrier<> closed;
  std::vector<std::unique_ptr<diloco::CoordinatorClient>> clients;  // one per worker, made before the threads start
};

void Bench::Heartbeats(const std::atomic<bool>& stop) {
  const auto period = std::chrono::milliseconds(static_cast<int64_t>(config.coordinator.heartbeat_interval_s * 1000));
  while (!stop) {
    for (auto& client : clients) (void)client->Heartbeat(0);
    const Clock::time_point slept = Clock::now();
    while (!stop && Clock::now() - slept < period) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// One simulated worker: Join, then per round pull (dropped), push the shared pseudo-gradient (OwnPushes), wait for the
// close; Leave. A failure marks the run failed but still passes every barrier, so the other threads finish.
void Bench::Worker(int w, const diloco::ModelSpec& spec, const std::vector<diloco::RoundResult>& results) {
  const std::string id = "push-" + std::to_string(w);
  const double timeout_s = RpcTimeout();
  diloco::CoordinatorClient& client = *clients[static_cast<size_t>(w)];
  auto stub = NewStub(address, config.comm.chunk_bytes);
  const int P = static_cast<int>(results.size());
  std::vector<diloco::RoundResult> own = OwnPushes(results, distinct_noise);
  if (!client.Join(spec, 1, "cpu", -1, P).ok()) failed = true;
  int64_t round = 0;
  for (int r = 0; r < rounds; ++r) {
    pull_ready.arrive_and_wait();
    auto got = PullAndDiscard(*stub, id, fingerprint, timeout_s);
    for (int retry = 0; retry < 50 && !got.ok() && absl::IsUnavailable(got.status()); ++retry) {  // as a worker does
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      got = PullAndDiscard(*stub, id, fingerprint, timeout_s);
    }
    if (got.ok()) {
      round = got->round;
      pulled += got->bytes;
      round_pulled += got->bytes;
    } else {
      std::cerr << "pull failed: " << got.status() << "\n";
      failed = true;
    }
    pull_done.arrive_and_wait();
    push_ready.arrive_and_wait();
    diloco::RoundResult& mine = own[static_cast<size_t>(round % P)];
    MarkPush(mine, w, round, results[static_cast<size_t>(round % P)]);
    auto sent = PushRetryingUnavailable(client, round, mine, timeout_s);
    if (sent.ok()) {
      pushed += *sent;
    } else {
      std::cerr << "push failed: " << sent.status() << "\n";
      failed = true;
    }
    push_done.arrive_and_wait();
    if (w == 0 && !failed) {  // a failed push leaves the round open: nothing to wait for
      auto step = WaitForClose(*stub, round, timeout_s);
      if (step.ok()) {
        outer_step_seconds.push_back(*step);
      } else {
        std::cerr << "waiting for the close: " << step.status() << "\n";
        failed = true;
      }
    }
    closed.arrive_and_wait();
  }
  (void)client.Leave("benchmark done");
}
// The JSON line's measurements (the probe's latencies aside).
nlohmann::json Summary(const Bench& bench, int64_t params) {
  const double push_median = Median(bench.push_seconds);
  const double per_round = static_cast<double>(bench.pushed) / bench.rounds;
  const std::vector<double>& steps = bench.outer_step_seconds;
  return {{"workers", bench.workers},
          {"rounds", bench.rounds},
          {"codec", std::string(diloco::EnumName(bench.config.comm.codec))},
          {"pull_codec", std::string(diloco::EnumName(bench.config.comm.pull_codec))},
          {"fragments", bench.config.comm.fragments},
          {"transport", std::string(diloco::EnumName(bench.config.comm.transport))},
          {"params", params},
          {"bytes_per_round", per_round},
          {"bytes_per_round_per_worker", per_round / bench.workers},
          {"push_phase_s", push_median},
          {"ingest_mb_per_s", per_round / push_median / 1e6},
          {"pull_bytes_per_round", static_cast<double>(bench.pulled) / bench.rounds},
          {"pull_phase_s", Median(bench.pull_seconds)},
          {"pull_fanout_mb_per_s", Median(bench.pull_rates)},
          {"outer_step_s", steps},
          {"outer_step_first_s", steps.empty() ? 0.0 : steps.front()},
          {"outer_step_median_s", Median(steps)},
          {"ok", !bench.failed}};
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Pull theta and push pseudo-gradients from W simulated workers to a running coordinator"};
  std::string config_path, address;
  std::vector<std::string> overrides;
  int workers = 2, rounds = 3, probe_ms = 0;
  double distinct_noise = 0;
  app.add_option("--config", config_path)->required();
  app.add_option("--set", overrides);
  app.add_option("--coordinator", address)->required();
  app.add_option("--workers", workers)->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds)->check(CLI::PositiveNumber);
  app.add_option("--probe-ms", probe_ms, "time a GetStatus and a Heartbeat every this many ms during pushes (0: off)");
  app.add_option("--distinct-noise", distinct_noise,
                 "add each worker's own N(0, this) to its push (a copy of the model per worker; 0: shared values)");
  CLI11_PARSE(app, argc, argv);
  auto config = diloco::LoadConfig(config_path, overrides);
  if (!config.ok()) {
    std::cerr << "error: " << config.status().message() << "\n";
    return 2;
  }
  // The model's parameters become the shared pseudo-gradient: the model itself (its buffers) is dropped.
  const diloco::NamedTensors params = diloco::NamedParameters(*diloco::MakeLanguageModel(config->model, 0));
  const std::vector<diloco::TensorSpec> specs = diloco::SpecsOf(params);
  const std::vector<diloco::RoundResult> results = SharedPseudoGradients(params, *config);
  diloco::ModelSpec spec;
  spec.set_vocab_size(config->model.vocab_size);
  spec.set_seq_len(config->model.seq_len);
  spec.set_n_layer(config->model.n_layer);
  spec.set_n_head(config->model.n_head);
  spec.set_d_model(config->model.d_model);

  Bench bench(*config, address, diloco::Fingerprint(specs), workers, rounds);
  bench.distinct_noise = distinct_noise;
  ProbeSamples probed;
  std::atomic<bool> stop_probe{false};
  std::thread probe;
  if (probe_ms > 0) {
    probe =
        std::thread([&] { probed = Probe(address, "push-0", bench.fingerprint, probe_ms, bench.pushing, stop_probe); });
  }
  for (int w = 0; w < workers; ++w) {
    bench.clients.push_back(std::make_unique<diloco::CoordinatorClient>(
        address, "push-" + std::to_string(w), bench.fingerprint, bench.RpcTimeout(), config->comm.chunk_bytes,
        diloco::CodecOf(config->comm.codec)));
    bench.clients.back()->set_topk({config->comm.topk_chunk, config->comm.topk_per_chunk});
  }
  std::atomic<bool> stop_heartbeats{false};
  std::thread heartbeats([&] { bench.Heartbeats(stop_heartbeats); });
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) threads.emplace_back([&, w] { bench.Worker(w, spec, results); });
  for (auto& t : threads) t.join();
  stop_heartbeats = true;
  heartbeats.join();
  stop_probe = true;
  if (probe.joinable()) probe.join();

  nlohmann::json out = Summary(bench, diloco::TotalElements(specs));
  if (probe_ms > 0) {
    out["probe_ms"] = probe_ms;
    out["probe_errors"] = probed.errors;
    AddLatencies(out, "status", probed.status_ms);
    AddLatencies(out, "heartbeat", probed.heartbeat_ms);
  }
  std::cout << out.dump() << std::endl;
  return bench.failed ? 1 : 0;
}
