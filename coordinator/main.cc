// diloco-coordinator: serves one DiLoCo run. Loads the config, makes sure the token cache exists, builds theta_0,
// starts the gRPC service and the round loop, and exits 0 once the last round is done and the workers have left.
// Exit codes: 0 complete, 1 complete but the final checkpoint could not be written, 130 stopped by SIGINT/SIGTERM,
// 2 a start-up error. Every start-up step returns an absl::Status; main is the one place that prints a start-up error
// (one line: the message, which names the key or path and what would fix it) and picks the exit code.
#include <ATen/Parallel.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <csignal>
#include <fstream>
#include <thread>

#include "absl/status/status.h"
#include "config/cli_flags.h"
#include "config/config_loader.h"
#include "config/data_cache.h"
#include "config/model_spec.h"
#include "config/subprocess.h"
#include "config/text_file.h"
#include "coordinator/bootstrap.h"
#include "coordinator/checkpoint_dir_lock.h"
#include "coordinator/coordinator.h"
#include "coordinator/http_status.h"
#include "coordinator/model_host.h"
#include "coordinator/service.h"
#include "coordinator/tcp_push_listener.h"
#include "proto/codec.h"
#include "proto/compute_threads.h"
#include "proto/transport_security.h"

namespace {

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal = sig; }

constexpr int kExitComplete = 0;
constexpr int kExitFinalCheckpointFailed = 1;  // complete, but theta_T is on no disk
constexpr int kExitStartUpError = 2;
constexpr int kExitStopped = 130;  // 128 + SIGINT, also after SIGTERM

// The one place that reports a failed start-up.
int StartUpFailed(const absl::Status& status) {
  spdlog::error("{}", std::string(status.message()));
  return kExitStartUpError;
}

// Writes `address` to `path` atomically (temp file + rename), for tests and launchers that listen on port 0.
void WriteAddressFile(const std::string& path, const std::string& address) {
  if (path.empty()) return;
  const absl::Status s = diloco::WriteTextFileAtomically(path, address + "\n");
  if (!s.ok()) spdlog::error("--port-file: {}", std::string(s.message()));
}

struct Flags {
  std::string config_path, port_file, metrics_port_file;
  std::vector<std::string> overrides;
  bool fresh = false;
};

// Everything the process serves with, in start-up order. One thread (main) builds it; the members are then used by
// the gRPC, HTTP, TCP and round threads as their own headers say.
struct Process {
  diloco::Config config;
  diloco::TransportSecurity security;
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::unique_ptr<diloco::CoordinatorCore> core;
  std::unique_ptr<diloco::HttpStatusServer> http;
  std::unique_ptr<diloco::CoordinatorService> service;
  std::unique_ptr<diloco::TcpPushListener> push_listener;  // destroyed before the service, after the server
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<diloco::CheckpointDirLock>
      checkpoint_lock;  // held until the process exits (null: none could be made)
  std::string host;     // of coordinator.listen
  std::string address;
};

// Config, security, token cache, theta_0 and the core.
absl::Status BuildCore(const Flags& flags, Process& p) {
  auto config = diloco::LoadConfig(flags.config_path, flags.overrides);
  if (!config.ok()) return config.status();
  p.config = *config;
  spdlog::info("config {} (hash {}):\n{}", flags.config_path, diloco::ConfigHash(p.config),
               diloco::RenderConfig(p.config));
  // Before anything reads or moves its checkpoints: one coordinator per checkpoint directory.
  auto lock = diloco::CheckpointDirLock::Acquire(p.config.CheckpointDir());
  if (!lock.ok()) return lock.status();
  p.checkpoint_lock = *std::move(lock);
  diloco::SetComputeThreads(static_cast<int>(p.config.coordinator.threads));
  // Transport security (docs/operations.md "Security"): TLS identity, mutual TLS with security.tls_ca, the shared
  // token.
  const diloco::SecurityConfig& sec = p.config.security;
  auto security = diloco::LoadTransportSecurity({sec.tls_cert, sec.tls_key, sec.tls_ca, sec.token_file, ""});
  if (!security.ok()) return security.status();
  p.security = std::move(*security);
  auto credentials = diloco::MakeServerCredentials(p.security);
  if (!credentials.ok()) return credentials.status();
  p.credentials = *credentials;
  auto cache = diloco::EnsureTokenized(p.config, diloco::SiblingExecutable("diloco-tokenize"));
  if (!cache.ok()) return cache.status();
  auto digest = diloco::VocabDigestOf(*cache, diloco::SiblingExecutable("diloco-tokenize"));  // checked at Join
  if (!digest.ok()) {
    spdlog::warn("{}; no worker's tokenizer is checked at Join", std::string(digest.status().message()));
  }
  auto model = diloco::HostModel(p.config, *cache);  // theta_0 (or model.init_from) and the validation evaluator
  if (!model.ok()) return model.status();
  auto core = diloco::CoordinatorCore::Create(p.config, std::move(model->theta_0), std::move(model->evaluator),
                                              /*resume=*/!flags.fresh);
  if (!core.ok()) return core.status();
  p.core = std::move(*core);
  p.core->set_data(diloco::DataSpecOf(p.config, digest.ok() ? *digest : std::string()));
  spdlog::info("model: {} parameters, fingerprint {}", diloco::TotalElements(p.core->specs()), p.core->fingerprint());
  p.host = p.config.coordinator.listen.substr(0, p.config.coordinator.listen.rfind(':'));
  return absl::OkStatus();
}

// Optional HTTP listener: /metrics (Prometheus), /status.json, / (status page). Started before the gRPC server so
// that a bad coordinator.metrics_listen fails the start-up before anything is served.
absl::Status StartHttp(Process& p) {
  const std::string& listen = p.config.coordinator.metrics_listen;
  if (listen.empty()) return absl::OkStatus();
  diloco::CoordinatorCore* core = p.core.get();
  auto started = diloco::HttpStatusServer::Start(listen, [core] { return core->Status(); });
  if (!started.ok()) return started.status();
  p.http = std::move(*started);
  spdlog::info("metrics on http://{}/metrics, status page http://{}/", p.http->address(), p.http->address());
  if (!diloco::IsLoopbackAddress(listen)) {
    spdlog::warn(
        "coordinator.metrics_listen {} is not a loopback address: /metrics, /status.json and / are plain "
        "HTTP without authentication (run status and worker ids; never the model)",
        listen);
  }
  return absl::OkStatus();
}

// comm.transport tcp: pushes on a plain TCP port beside gRPC (same host); Join replies tell workers the port, so it
// is listening before the first Join can come.
absl::Status StartPushListener(Process& p) {
  if (p.config.comm.transport != diloco::PushTransport::kTcp) return absl::OkStatus();
  p.push_listener = std::make_unique<diloco::TcpPushListener>(
      p.core.get(), p.service->ingest(), p.security.token,
      static_cast<uint64_t>(diloco::MaxMessageBytes(p.config.comm.chunk_bytes)));
  auto push_port = p.push_listener->Start(p.host, static_cast<int>(p.config.comm.tcp_port));
  if (!push_port.ok()) return push_port.status();
  p.core->set_push_port(*push_port);
  spdlog::info("pushes over tcp on {}:{} (comm.transport tcp)", p.host, *push_port);
  return absl::OkStatus();
}

// While coordinator.grpc_memory_quota_mb is on (see StartGrpc): each stream's receive window, and the threads gRPC
// may start for synchronous services (server reflection; ours use the callback API on gRPC's own threads), so that
// calls to those cannot start threads without bound (beyond it: RESOURCE_EXHAUSTED).
constexpr int kStreamWindowBytes = 4 << 20;
constexpr int kMaxSyncThreads = 16;

// The gRPC service with health and reflection; keepalive pings allowed; messages up to MaxMessageBytes (a chunk plus 1
// MiB).
absl::Status StartGrpc(Process& p) {
  const diloco::Config& c = p.config;
  p.service = std::make_unique<diloco::CoordinatorService>(p.core.get(), c.comm.chunk_bytes,
                                                           diloco::CodecOf(c.comm.pull_codec), p.security.token);
  // Standard grpc.health.v1.Health (SERVING while the run goes on) and server reflection (for grpcurl and the like).
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(c.coordinator.listen, p.credentials, &port);
  builder.RegisterService(p.service.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(diloco::MaxMessageBytes(c.comm.chunk_bytes)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  // gRPC binds with SO_REUSEPORT by default: a second coordinator on a port the run's coordinator serves would bind
  // too and take some of the workers' connections. One coordinator a port: the second fails to start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Memory before parsing (docs/operations.md "Security"): gRPC 1.51 buffers a whole message before its size limit
  // refuses it
  // (it widens the stream's flow-control window to the message's size), and a unary request is read before the
  // handler checks the token, so a peer could make the coordinator hold a message of any size. A gRPC resource quota
  // (coordinator.grpc_memory_quota_mb, default 32) bounds it: incoming bytes are charged to the quota and, once it is
  // spent, gRPC resets the stream or closes the connection. With the quota on, BDP probing is off and each stream's
  // receive window is fixed at kStreamWindowBytes (a message being read still gets a window of its size): with BDP
  // probing the windows grow with the bandwidth until honest pushes alone spend the quota (measured on loopback with
  // `scripts/bench/comm latency`: 8 workers pushing a 27M model through a 32 MiB quota lost their connections; with
  // fixed windows they did not, scripts/bench/results/grpc_quota.md). The cost is a ceiling per push stream of about
  // (kStreamWindowBytes + comm.chunk_bytes) per round trip.
  if (c.coordinator.grpc_memory_quota_mb > 0) {
    // Each push stream in flight may hold its window and a message: with every worker pushing at once (each rank of a
    // cluster on a stream of its own with comm.cluster_parts) that can exceed the quota. 8 workers pushing the 155.5M
    // model at once through 32 MiB were reset in every round; a 27M model's were not (docs/benchmarks.md).
    const int64_t streams = c.workers.count * (c.comm.cluster_parts ? c.workers.cluster_size : 1);
    const int64_t per_push = kStreamWindowBytes + diloco::MaxMessageBytes(c.comm.chunk_bytes);
    const int64_t needed_mb = (streams * per_push + (int64_t{1} << 20) - 1) >> 20;
    if (c.coordinator.grpc_memory_quota_mb < needed_mb) {
      spdlog::warn(
          "coordinator.grpc_memory_quota_mb {} MiB is below what {} push streams at once may hold ({} MiB: a {} MiB "
          "window and a message each); if pushes are reset (RESOURCE_EXHAUSTED) the workers stop: set it to {}",
          c.coordinator.grpc_memory_quota_mb, streams, needed_mb, kStreamWindowBytes >> 20, needed_mb);
    }
    static grpc::ResourceQuota quota("diloco-coordinator");
    quota.Resize(static_cast<size_t>(c.coordinator.grpc_memory_quota_mb) << 20);
    quota.SetMaxThreads(kMaxSyncThreads);
    builder.SetResourceQuota(quota);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
  }
  if (absl::Status s = StartPushListener(p); !s.ok()) return s;
  p.server = builder.BuildAndStart();
  if (!p.server || port == 0) {
    return absl::UnavailableError("coordinator.listen: cannot listen on '" + c.coordinator.listen +
                                  "' (address in use or invalid? use HOST:PORT, port 0 picks a free one)");
  }
  p.address = p.host + ":" + std::to_string(port);
  return absl::OkStatus();
}

void LogTransport(const Process& p) {
  spdlog::info("listening on {}; waiting for workers ({} rounds of {} inner steps)", p.address, p.config.outer.rounds,
               p.config.inner.steps);
  spdlog::info("transport: {}; {}",
               p.security.mutual_tls()   ? "mutual TLS (client certificates required)"
               : p.security.server_tls() ? "TLS (no client certificates)"
                                         : "plaintext",
               p.security.token.empty() ? "no token" : "token required on every call");
  if (!p.security.server_tls() && !diloco::IsLoopbackAddress(p.config.coordinator.listen)) {
    spdlog::warn(
        "coordinator.listen {} is not a loopback address and the transport is plaintext: anyone who can "
        "reach it can join or read the model; set security.tls_cert/tls_key (and tls_ca for mutual TLS)",
        p.config.coordinator.listen);
  }
}

// Every start-up step, in order, up to serving; the first error ends the start-up.
absl::Status StartUp(const Flags& flags, Process& p) {
  if (absl::Status s = BuildCore(flags, p); !s.ok()) return s;
  if (absl::Status s = StartHttp(p); !s.ok()) return s;
  if (absl::Status s = StartGrpc(p); !s.ok()) return s;
  // Now that the port is this process's (not a coordinator's still serving the run): tidy the checkpoint directory.
  if (absl::Status s = diloco::PrepareCheckpointDir(p.config, flags.fresh); !s.ok()) return s;
  LogTransport(p);
  p.server->GetHealthCheckService()->SetServingStatus(true);
  WriteAddressFile(flags.port_file, p.address);
  if (p.http) WriteAddressFile(flags.metrics_port_file, p.http->address());
  return absl::OkStatus();
}

// Stops serving, in the order that lets nothing outlive what it uses: an operator checkpoint being written finishes
// and is answered (its executor is joined) before the server cancels what is still in flight (the core has stopped:
// a pull or push can no longer matter; it answers any heartbeat it still holds), then the TCP connections are closed.
// The service and the core are destroyed after this, with the Process.
void StopServing(Process& p) {
  p.server->GetHealthCheckService()->SetServingStatus(false);
  if (p.http) p.http->Stop();
  p.service->StopCheckpoints();
  p.core->Stop();  // answers the heartbeats it holds (HeartbeatRequest.wait_ms): Shutdown waits for every call
  p.server->Shutdown(std::chrono::system_clock::now());
  if (p.push_listener) p.push_listener->Stop();
}

// Runs the round loop until the run is complete or a signal comes; then lets the workers leave and shuts down.
// Returns the exit code: 0 complete, 1 complete without its final checkpoint, 130 stopped.
int ServeUntilDone(Process& p) {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  diloco::CoordinatorCore* core = p.core.get();
  // A signal stops the core, also once the run is complete (the waits for workers and watchers then end at once).
  std::atomic<bool> done{false};
  std::thread watcher([core, &done] {
    while (!done && g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (g_signal != 0) {
      spdlog::warn("signal {}: stopping (the last checkpoint stays on disk)", g_signal.load());
      core->Stop();
    }
  });
  core->Run();
  const bool complete = core->complete();
  if (complete) {
    spdlog::info("run complete; waiting for workers to leave");
    core->WaitForWorkersToLeave(std::max(15.0, 3 * p.config.coordinator.heartbeat_interval_s));
    core->WriteSummary();
    core->WaitForWatchers();
  }
  done = true;
  StopServing(p);
  watcher.join();
  const std::string final_error = complete ? core->final_checkpoint_error() : "";
  if (!final_error.empty()) {
    spdlog::error(
        "the run is complete but its final checkpoint could not be written ({}); a restart resumes from the newest "
        "checkpoint on disk and trains the rounds after it again",
        final_error);
    return kExitFinalCheckpointFailed;
  }
  spdlog::info("exit");
  return complete ? kExitComplete : kExitStopped;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DiLoCo coordinator: holds the global parameters and runs the outer optimizer"};
  Flags flags;
  app.add_option("--config", flags.config_path, "run config (YAML)")->required();
  app.add_option("--set", flags.overrides, "override a config key: section.key=value (repeatable)");
  app.add_option("--port-file", flags.port_file, "write HOST:PORT here once listening (for coordinator.listen port 0)");
  app.add_option("--metrics-port-file", flags.metrics_port_file,
                 "write HOST:PORT of the HTTP metrics listener here once listening (coordinator.metrics_listen)");
  app.add_flag(
      "--fresh", flags.fresh,
      "start from theta_0; checkpoints already in coordinator.checkpoint_dir are moved to before-fresh-<UTC time>/");
  if (const int code = diloco::ParseFlags(app, argc, argv); code >= 0) return code;
  spdlog::set_pattern("%H:%M:%S.%e %^%l%$ coordinator: %v");

  Process p;
  if (absl::Status s = StartUp(flags, p); !s.ok()) return StartUpFailed(s);
  return ServeUntilDone(p);
}
