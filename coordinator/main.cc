// diloco-coordinator: serves one DiLoCo run. Loads the config, makes sure the token cache exists, builds theta_0,
// starts the gRPC service and the round loop, and exits 0 once the last round is done and the workers have left.
#include <ATen/Parallel.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <fstream>
#include <thread>

#include "config/config_loader.h"
#include "config/data_cache.h"
#include "config/subprocess.h"
#include "coordinator/coordinator.h"
#include "coordinator/http_status.h"
#include "config/text_file.h"
#include "coordinator/service.h"
#include "coordinator/tcp_push_listener.h"
#include "proto/compute_threads.h"
#include "proto/transport_security.h"
#include "proto/codec.h"

namespace {

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal = sig; }

int Fail(const std::string& message, int code = 2) {
  spdlog::error("{}", message);
  return code;
}

// Writes `address` to `path` atomically (temp file + rename), for tests and launchers that listen on port 0.
void WriteAddressFile(const std::string& path, const std::string& address) {
  if (path.empty()) return;
  const absl::Status s = diloco::WriteTextFileAtomically(path, address + "\n");
  if (!s.ok()) spdlog::error("--port-file: {}", std::string(s.message()));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DiLoCo coordinator: holds the global parameters and runs the outer optimizer"};
  std::string config_path, port_file, metrics_port_file;
  std::vector<std::string> overrides;
  app.add_option("--config", config_path, "run config (YAML)")->required();
  app.add_option("--set", overrides, "override a config key: section.key=value (repeatable)");
  bool fresh = false;
  app.add_option("--port-file", port_file, "write HOST:PORT here once listening (for coordinator.listen port 0)");
  app.add_option("--metrics-port-file", metrics_port_file,
                 "write HOST:PORT of the HTTP metrics listener here once listening (coordinator.metrics_listen)");
  app.add_flag("--fresh", fresh, "ignore checkpoints in coordinator.checkpoint_dir and start from theta_0");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_pattern("%H:%M:%S.%e %^%l%$ coordinator: %v");

  auto config = diloco::LoadConfig(config_path, overrides);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  spdlog::info("config {} (hash {}):\n{}", config_path, diloco::ConfigHash(*config), diloco::RenderConfig(*config));
  diloco::SetComputeThreads(static_cast<int>(config->coordinator.threads));
  // Transport security (README "Security"): TLS identity, mutual TLS with security.tls_ca, the shared token.
  const diloco::SecurityConfig& sec = config->security;
  auto security = diloco::LoadTransportSecurity({sec.tls_cert, sec.tls_key, sec.tls_ca, sec.token_file, ""});
  if (!security.ok()) return Fail(std::string(security.status().message()));
  auto credentials = diloco::MakeServerCredentials(*security);
  if (!credentials.ok()) return Fail(std::string(credentials.status().message()));

  auto cache = diloco::EnsureTokenized(*config, diloco::SiblingExecutable("diloco-tokenize"));
  if (!cache.ok()) return Fail(std::string(cache.status().message()));
  auto core = diloco::CoordinatorCore::Create(*config, *cache, /*resume=*/!fresh);
  if (!core.ok()) return Fail(std::string(core.status().message()));
  spdlog::info("model: {} parameters, fingerprint {}", diloco::TotalElements((*core)->specs()),
               (*core)->fingerprint());

  // Optional HTTP listener: /metrics (Prometheus), /status.json, / (status page). Started before the gRPC server so
  // that a bad coordinator.metrics_listen fails the start-up before anything is served.
  std::unique_ptr<diloco::HttpStatusServer> http;
  if (!config->coordinator.metrics_listen.empty()) {
    diloco::CoordinatorCore* core_ptr = core->get();
    auto started = diloco::HttpStatusServer::Start(config->coordinator.metrics_listen,
                                                   [core_ptr] { return core_ptr->Status(); });
    if (!started.ok()) return Fail(std::string(started.status().message()));
    http = std::move(*started);
    spdlog::info("metrics on http://{}/metrics, status page http://{}/", http->address(), http->address());
    if (!diloco::IsLoopbackAddress(config->coordinator.metrics_listen)) {
      spdlog::warn("coordinator.metrics_listen {} is not a loopback address: /metrics, /status.json and / are plain "
                   "HTTP without authentication (run status and worker ids; never the model)",
                   config->coordinator.metrics_listen);
    }
  }

  diloco::CoordinatorService service(core->get(), config->comm.chunk_bytes,
                                     diloco::CodecOf(config->comm.pull_codec), security->token);
  // Standard grpc.health.v1.Health (SERVING while the run goes on) and server reflection (for grpcurl and the like).
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config->coordinator.listen, *credentials, &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config->comm.chunk_bytes) + (1 << 20));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  // comm.transport tcp: pushes on a plain TCP port beside gRPC (same host); Join replies tell workers the port, so it
  // is listening before the first Join can come.
  const std::string host = config->coordinator.listen.substr(0, config->coordinator.listen.rfind(':'));
  std::unique_ptr<diloco::TcpPushListener> push_listener;
  if (config->comm.transport == diloco::PushTransport::kTcp) {
    push_listener = std::make_unique<diloco::TcpPushListener>(
        core->get(), security->token, static_cast<uint64_t>(config->comm.chunk_bytes) + (1 << 20));
    auto push_port = push_listener->Start(host, static_cast<int>(config->comm.tcp_port));
    if (!push_port.ok()) return Fail(std::string(push_port.status().message()));
    (*core)->set_push_port(*push_port);
    spdlog::info("pushes over tcp on {}:{} (comm.transport tcp)", host, *push_port);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return Fail("coordinator.listen: cannot listen on '" + config->coordinator.listen +
                "' (address in use or invalid? use HOST:PORT, port 0 picks a free one)");
  }
  const std::string address = host + ":" + std::to_string(port);
  spdlog::info("listening on {}; waiting for workers ({} rounds of {} inner steps)", address, config->outer.rounds,
               config->inner.steps);
  spdlog::info("transport: {}; {}", security->mutual_tls()   ? "mutual TLS (client certificates required)"
                                    : security->server_tls() ? "TLS (no client certificates)"
                                                             : "plaintext",
               security->token.empty() ? "no token" : "token required on every call");
  if (!security->server_tls() && !diloco::IsLoopbackAddress(config->coordinator.listen)) {
    spdlog::warn("coordinator.listen {} is not a loopback address and the transport is plaintext: anyone who can "
                 "reach it can join or read the model; set security.tls_cert/tls_key (and tls_ca for mutual TLS)",
                 config->coordinator.listen);
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  WriteAddressFile(port_file, address);
  if (http) WriteAddressFile(metrics_port_file, http->address());

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::thread watcher([&] {
    while (!(*core)->complete() && g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (g_signal != 0) {
      spdlog::warn("signal {}: stopping (the last checkpoint stays on disk)", g_signal.load());
      (*core)->Stop();
    }
  });
  (*core)->Run();
  const bool complete = (*core)->complete();
  if (complete) {
    spdlog::info("run complete; waiting for workers to leave");
    (*core)->WaitForWorkersToLeave(std::max(15.0, 3 * config->coordinator.heartbeat_interval_s));
    (*core)->WriteSummary();
  }
  server->GetHealthCheckService()->SetServingStatus(false);
  if (http) http->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  watcher.join();
  spdlog::info("exit");
  return complete ? 0 : 130;
}
