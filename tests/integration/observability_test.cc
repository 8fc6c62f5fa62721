// Observability of a real run: the coordinator's HTTP listener (coordinator.metrics_listen) serves Prometheus
// /metrics, /status.json and a status page that headless Chromium renders; the gRPC server answers the standard
// grpc.health.v1 health check and server reflection. A real diloco-coordinator on 127.0.0.1 (ports picked by the
// OS) and two real diloco-worker processes train config/tiny.yaml while the test looks.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

constexpr double kTokensPerWorkerRound = 10 * 8 * 32;  // tiny.yaml: H x batch x seq_len

// One scrape of /metrics: "name{labels}" -> value. Fails the test on a line that is not a valid sample.
std::map<std::string, double> ParseMetrics(const std::string& text) {
  static const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})?) (\S+)$)");
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::smatch m;
    if (!std::regex_match(line, m, sample)) {
      ADD_FAILURE() << "not a Prometheus sample line: " << line;
      continue;
    }
    out[m[1]] = std::stod(m[3]);
  }
  return out;
}

struct Http {
  explicit Http(const std::string& address)
      : client(address.substr(0, address.rfind(':')), std::stoi(address.substr(address.rfind(':') + 1))) {
    client.set_connection_timeout(5);
    client.set_read_timeout(10);
  }
  // The body of a GET that must answer 200 (empty string and a test failure otherwise).
  std::string Get(const std::string& path, std::string* content_type = nullptr) {
    auto res = client.Get(path.c_str());
    if (!res) {
      ADD_FAILURE() << "GET " << path << ": " << httplib::to_string(res.error());
      return "";
    }
    EXPECT_EQ(res->status, 200) << path << ": " << res->body;
    if (content_type != nullptr) *content_type = res->get_header_value("Content-Type");
    return res->body;
  }
  std::map<std::string, double> Metrics() { return ParseMetrics(Get("/metrics")); }
  httplib::Client client;
};

// Polls /metrics until `done` holds for a scrape (returned), or timeout_s passes (empty map).
template <typename Pred>
std::map<std::string, double> WaitForMetrics(Http& http, double timeout_s, Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    std::map<std::string, double> m = http.Metrics();
    if (done(m)) return m;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return {};
}

std::string BufferToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer StringToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// Waits for the completion queue to return `tag`; the operation's ok flag.
bool Await(grpc::CompletionQueue& cq, int tag) {
  void* got = nullptr;
  bool ok = false;
  EXPECT_TRUE(cq.Next(&got, &ok));
  EXPECT_EQ(got, reinterpret_cast<void*>(static_cast<intptr_t>(tag)));
  return ok;
}
void* Tag(int tag) { return reinterpret_cast<void*>(static_cast<intptr_t>(tag)); }

// grpc.health.v1.Health/Check with a hand-encoded HealthCheckRequest{service} (field 1, string); the reply's bytes.
// The generated health stubs are not in Debian's libgrpc++-dev, and the wire format of these two messages is tiny.
grpc::Status HealthCheck(const std::string& address, const std::string& service, std::string* reply_bytes) {
  static const std::string kMethod = "/grpc.health.v1.Health/Check";
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  std::string request;
  if (!service.empty()) request = std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&ctx, kMethod, StringToBuffer(request), &cq);
  call->StartCall();
  grpc::ByteBuffer reply;
  grpc::Status status;
  call->Finish(&reply, &status, Tag(1));
  Await(cq, 1);
  if (status.ok()) *reply_bytes = BufferToString(reply);
  return status;
}

// grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo with ServerReflectionRequest{list_services: ""}
// (field 7, string); the first response's bytes, which name every service the server has.
std::string ListServicesByReflection(const std::string& address) {
  static const std::string kMethod = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&ctx, kMethod, &cq);
  call->StartCall(Tag(1));
  if (!Await(cq, 1)) return "";
  call->Write(StringToBuffer(std::string("\x3a\x00", 2)), Tag(2));
  EXPECT_TRUE(Await(cq, 2));
  call->WritesDone(Tag(3));
  EXPECT_TRUE(Await(cq, 3));
  grpc::ByteBuffer response;
  call->Read(&response, Tag(4));
  const bool read = Await(cq, 4);
  grpc::Status status;
  call->Finish(&status, Tag(5));
  Await(cq, 5);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return read ? BufferToString(response) : "";
}

// Runs a shell command line with a deadline; its stdout (stderr goes where the command line sends it). The command
// runs in its own process group, which is killed at the deadline or once it exits (Chromium leaves helpers behind).
std::string RunCapture(const std::string& command_line, double timeout_s, int* exit_code) {
  Subprocess::Options options;
  options.capture_output = true;
  options.own_process_group = true;
  auto p = Subprocess::Start({"/bin/sh", "-c", command_line}, options);
  if (!p.ok()) {
    ADD_FAILURE() << p.status();
    return "";
  }
  std::string out;
  const int fd = p->output_fd();
  std::thread reader([&out, fd] {
    char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
      if (n > 0) out.append(buf, n);
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  *exit_code = -1;
  while (!p->Poll(exit_code)) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(-p->pid(), SIGKILL);
      p->Wait();
      *exit_code = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(-p->pid(), SIGKILL);  // helpers still holding the pipe
  reader.join();
  return out;
}

std::string ChromiumPath() {
  for (const char* path : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

std::string WaitForFile(RunningProcess& process, const std::string& path) {
  for (int i = 0; i < 1200 && process.Running(); ++i) {
    std::string text = std::filesystem::exists(path) ? ReadFile(path) : "";
    if (!text.empty() && text.back() == '\n') return text.substr(0, text.size() - 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

TEST(Observability, MetricsStatusPageHealthAndReflectionDuringARun) {
  const std::string chromium = ChromiumPath();
  ASSERT_FALSE(chromium.empty()) << "chromium is not installed (scripts/setup installs Debian's chromium)";
  const std::string dir = ScratchDir("observability");
  // Many rounds (about 20 ms each), so the run is still going while the test looks, however long a loaded machine
  // takes to start chromium; the test stops it.
  const std::vector<std::string> overrides = {"coordinator.metrics_listen=127.0.0.1:0", "outer.rounds=20000"};
  RunningProcess coordinator(
      "diloco-coordinator",
      With(TinyArgs(dir, overrides), {"--port-file", dir + "/addr", "--metrics-port-file", dir + "/metrics_addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();
  const std::string metrics_address = WaitForFile(coordinator, dir + "/metrics_addr");
  ASSERT_FALSE(metrics_address.empty()) << coordinator.output();
  ASSERT_NE(metrics_address, "127.0.0.1:0");
  Http http(metrics_address);

  // Before any worker: the run is waiting, nobody is a member.
  std::map<std::string, double> m = http.Metrics();
  EXPECT_EQ(m["diloco_round"], 0);
  EXPECT_EQ(m["diloco_rounds_planned"], 20000);
  EXPECT_EQ(m["diloco_members{state=\"active\"}"], 0);

  RunningProcess w0("diloco-worker", With(TinyArgs(dir, overrides), {"--coordinator", address, "--id", "w0"}));
  RunningProcess w1("diloco-worker", With(TinyArgs(dir, overrides), {"--coordinator", address, "--id", "w1"}));

  m = WaitForMetrics(http, 120, [](std::map<std::string, double>& s) {
    return s["diloco_round"] >= 1 && s["diloco_members{state=\"active\"}"] == 2;
  });
  ASSERT_FALSE(m.empty()) << "no round committed with 2 active members within 120 s\n" << coordinator.output();
  const double round = m["diloco_round"];
  const double params = m["diloco_parameters"];
  EXPECT_GT(params, 10000);
  EXPECT_EQ(m["diloco_members{state=\"lost\"}"], 0);
  EXPECT_EQ(m["diloco_members{state=\"left\"}"], 0);
  EXPECT_EQ(m.count("diloco_phase{phase=\"waiting\"}"), 0u);  // the series are exactly proto/round_phase.h's
  EXPECT_EQ(m.count("diloco_phase{phase=\"finishing\"}"), 1u);
  EXPECT_EQ(m["diloco_phase{phase=\"training\"}"] + m["diloco_phase{phase=\"stepping\"}"] +
                m["diloco_phase{phase=\"finishing\"}"] + m["diloco_phase{phase=\"complete\"}"],
            1);
  // Both workers contribute to every round (min_workers 2), fp32 pseudo-gradients: exact figures per round.
  EXPECT_EQ(m["diloco_tokens_total"], 2 * kTokensPerWorkerRound * round);
  EXPECT_EQ(m["diloco_worker_tokens_total{worker=\"w0\"}"], kTokensPerWorkerRound * round);
  EXPECT_EQ(m["diloco_bytes_pushed_committed_total"], 2 * 4 * params * round);
  EXPECT_EQ(m["diloco_last_round_bytes_pushed"], 2 * 4 * params);
  EXPECT_EQ(m["diloco_dp_equivalent_bytes_total"], 2 * 10 * 4 * params * round);  // ring all-reduce, k = 2, H = 10
  EXPECT_GE(m["diloco_bytes_received_total"], m["diloco_bytes_pushed_committed_total"]);
  EXPECT_GE(m["diloco_bytes_sent_total"], 2 * 4 * params * round);  // every round, each worker pulls theta
  EXPECT_GT(m["diloco_last_round_seconds"], 0);
  EXPECT_GT(m["diloco_last_outer_step_seconds"], 0);
  ASSERT_EQ(m.count("diloco_val_loss"), 1u);
  EXPECT_GT(m["diloco_val_loss"], 0.5);
  EXPECT_LT(m["diloco_val_loss"], 6.0);  // ln(128) = 4.85 at random init
  EXPECT_GE(m["diloco_val_loss_round"], round - 1);
  for (const std::string w : {"w0", "w1"}) {
    EXPECT_EQ(m["diloco_worker_state{worker=\"" + w + "\",state=\"active\"}"], 1) << w;
    ASSERT_EQ(m.count("diloco_worker_tokens_per_second{worker=\"" + w + "\"}"), 1u) << w;
    EXPECT_GT(m["diloco_worker_tokens_per_second{worker=\"" + w + "\"}"], 0) << w;
    EXPECT_GT(m["diloco_worker_last_loss{worker=\"" + w + "\"}"], 0.5) << w;
    EXPECT_LT(m["diloco_worker_last_loss{worker=\"" + w + "\"}"], 6.0) << w;
  }

  // The same figures through the gRPC status (diloco-ctl) and /status.json.
  RunningProcess ctl("diloco-ctl", {"status", "--addr", address, "--json"});
  ASSERT_EQ(ctl.Wait(30), 0) << ctl.output();
  const nlohmann::json status = nlohmann::json::parse(ctl.output());
  EXPECT_EQ(status["params"].get<double>(), params);
  EXPECT_GE(status["round"].get<double>(), round);
  // The run settings a foreign client reads (proto/PROTOCOL.md "Run settings"): tiny.yaml's, defaults resolved.
  const nlohmann::json& model = status["model"];
  EXPECT_EQ(model["arch"], "gpt");
  EXPECT_EQ(model["vocab_size"].get<int64_t>(), 128);
  EXPECT_EQ(model["seq_len"].get<int64_t>(), 32);
  EXPECT_EQ(model["n_layer"].get<int64_t>(), 1);
  EXPECT_EQ(model["n_head"].get<int64_t>(), 2);
  EXPECT_EQ(model["n_kv_head"].get<int64_t>(), 2);
  EXPECT_EQ(model["d_model"].get<int64_t>(), 32);
  EXPECT_EQ(model["ffn_hidden"].get<int64_t>(), 128);
  EXPECT_EQ(status["inner_steps"].get<int64_t>(), 10);
  EXPECT_EQ(status["lease_ms"].get<int64_t>(), 10000);
  EXPECT_EQ(status["heartbeat_interval_ms"].get<int64_t>(), 500);
  EXPECT_EQ(status["chunk_bytes"].get<int64_t>(), 1 << 20);
  EXPECT_EQ(status["max_message_bytes"].get<int64_t>(), 2 << 20);
  RunningProcess human("diloco-ctl", {"status", "--addr", address});
  ASSERT_EQ(human.Wait(30), 0) << human.output();
  EXPECT_NE(
      human.output().find("model settings: arch gpt, vocab 128, seq_len 32, layers 1, heads 2 (kv 2), d_model 32, "
                          "ffn 128"),
      std::string::npos)
      << human.output();
  EXPECT_NE(human.output().find("protocol: H 10, fragments 1, chunk 1048576 B, max message 2097152 B, lease 10000 ms, "
                                "heartbeat 500 ms"),
            std::string::npos)
      << human.output();
  std::string content_type;
  const nlohmann::json json = nlohmann::json::parse(http.Get("/status.json", &content_type));
  EXPECT_EQ(content_type, "application/json");
  EXPECT_EQ(json["params"].get<double>(), params);
  EXPECT_EQ(json["model"]["d_model"].get<int64_t>(), 32);
  EXPECT_EQ(json["lease_ms"].get<int64_t>(), 10000);
  EXPECT_GE(json["round"].get<double>(), status["round"].get<double>());
  ASSERT_EQ(json["workers"].size(), 2u);
  http.Get("/metrics", &content_type);
  EXPECT_EQ(content_type, "text/plain; version=0.0.4; charset=utf-8");
  auto missing = http.client.Get("/no-such-page");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  auto post = http.client.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);

  // gRPC health (SERVING = 1: bytes 08 01) and reflection (lists the coordinator's own service).
  std::string reply;
  grpc::Status health = HealthCheck(address, "", &reply);
  EXPECT_TRUE(health.ok()) << health.error_message();
  EXPECT_EQ(reply, std::string("\x08\x01", 2));
  EXPECT_EQ(HealthCheck(address, "no.such.Service", &reply).error_code(), grpc::StatusCode::NOT_FOUND);
  const std::string services = ListServicesByReflection(address);
  EXPECT_NE(services.find("diloco.Coordinator"), std::string::npos) << services;
  EXPECT_NE(services.find("grpc.health.v1.Health"), std::string::npos) << services;

  // The status page in headless Chromium: after its scripts ran, the DOM shows the round, both workers active and a
  // validation-loss chart with points.
  const double round_before = http.Metrics()["diloco_round"];
  int chromium_exit = 0;
  const std::string dom =
      RunCapture(chromium +
                     " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --disable-background-networking "
                     "--no-first-run --user-data-dir=" +
                     dir +
                     "/chromium-profile --virtual-time-budget=8000 "
                     "--dump-dom http://" +
                     metrics_address + "/ 2>" + dir + "/chromium.log",
                 180, &chromium_exit);
  const double round_after = http.Metrics()["diloco_round"];
  ASSERT_EQ(chromium_exit, 0) << "chromium: " << ReadFile(dir + "/chromium.log");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(dom, match, std::regex(R"(<b id="round">(\d+)</b>)"))) << dom;
  const double shown_round = std::stod(match[1]);
  EXPECT_GE(shown_round, round_before);
  EXPECT_LE(shown_round, round_after);
  EXPECT_TRUE(std::regex_search(dom, std::regex(R"(<b id="rounds-total">20000</b>)"))) << dom;
  for (const std::string w : {"w0", "w1"}) {
    EXPECT_TRUE(std::regex_search(
        dom, std::regex("<tr class=\"member\" data-worker=\"" + w + "\" data-state=\"active\"><td>" + w + "</td>")))
        << w << "\n"
        << dom;
  }
  ASSERT_TRUE(std::regex_search(dom, match, std::regex(R"(<svg id="chart-round"[^>]*>([\s\S]*?)</svg>)"))) << dom;
  const std::string chart = match[1];
  EXPECT_NE(chart.find("<polyline class=\"line\""), std::string::npos) << chart;
  EXPECT_NE(chart.find("<circle class=\"pt\""), std::string::npos) << chart;
  EXPECT_NE(chart.find("data-x=\"0\""), std::string::npos) << "the eval before round 1 is plotted\n" << chart;
  EXPECT_NE(dom.find("<p id=\"error\" class=\"error\"></p>"), std::string::npos) << "the page shows an error\n" << dom;

  // Workers leave: the members gauge follows.
  w0.Signal(SIGTERM);
  w1.Signal(SIGTERM);
  EXPECT_EQ(w0.Wait(60), 0) << w0.output();
  EXPECT_EQ(w1.Wait(60), 0) << w1.output();
  m = http.Metrics();
  EXPECT_EQ(m["diloco_members{state=\"active\"}"], 0);
  EXPECT_EQ(m["diloco_members{state=\"left\"}"], 2);
  EXPECT_EQ(m["diloco_worker_state{worker=\"w0\",state=\"left\"}"], 1);
  coordinator.Signal(SIGTERM);
  EXPECT_EQ(coordinator.Wait(60), 130) << coordinator.output();
}

TEST(Observability, MetricsAddressInUseIsOneClearLineAndExit2) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string taken = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  const std::string dir = ScratchDir("metrics_in_use");
  RunningProcess coordinator("diloco-coordinator", TinyArgs(dir, {"coordinator.metrics_listen=" + taken}));
  EXPECT_EQ(coordinator.Wait(60), 2) << coordinator.output();
  EXPECT_NE(coordinator.output().find("coordinator.metrics_listen: cannot listen on '" + taken + "'"),
            std::string::npos)
      << coordinator.output();
  close(fd);
}

}  // namespace
}  // namespace diloco::testing
