// Integration tests: a real diloco-coordinator on 127.0.0.1 and real diloco-worker processes train the tiny config
// on tinyshakespeare; also the launcher, the status RPC through diloco-ctl, and refusals at start-up.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "config/config_loader.h"
#include "config/data_cache.h"
#include "proto/push_frames.h"
#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

TEST(Run, TwoWorkersTrainThreeRoundsAndLossFalls) {
  const std::string dir = ScratchDir("two_workers");
  RunningProcess coordinator("diloco-coordinator", With(TinyArgs(dir), {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();

  RunningProcess w0("diloco-worker", With(TinyArgs(dir), {"--coordinator", address, "--id", "w0"}));

  // The status RPC answers while the run goes on, in the documented JSON shape. With w0 joined and w1 not yet
  // started, round 1 cannot close (min_workers 2), so the run is surely still going when ctl asks.
  ASSERT_TRUE(coordinator.WaitForOutput("joined: worker", 60));
  RunningProcess ctl("diloco-ctl", {"status", "--addr", address, "--json"});
  ASSERT_EQ(ctl.Wait(30), 0) << ctl.output();
  // An operator watches the run to its end: the watch ends with exit 0 on the completed run (the coordinator waits
  // for it). Before, the coordinator exited between two polls and the watch ended with "failed to connect", exit 1.
  RunningProcess watch("diloco-ctl", {"status", "--addr", address, "--watch", "--interval", "2"});
  RunningProcess w1("diloco-worker", With(TinyArgs(dir), {"--coordinator", address, "--id", "w1"}));
  const nlohmann::json live = nlohmann::json::parse(ctl.output());
  for (const char* key :
       {"round", "phase", "params", "fingerprint", "bytes_received", "bytes_sent", "workers", "evals"}) {
    EXPECT_TRUE(live.contains(key)) << key;
  }
  EXPECT_GT(live["params"].get<int64_t>(), 10000);

  ASSERT_EQ(w0.Wait(120), 0) << w0.output();
  ASSERT_EQ(w1.Wait(120), 0) << w1.output();
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  EXPECT_EQ(watch.Wait(30), 0) << watch.output();
  EXPECT_NE(watch.output().find("run tiny: 3/3 rounds done; complete"), std::string::npos) << watch.output();

  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  EXPECT_EQ(summary["round"].get<int64_t>(), 3);
  EXPECT_EQ(summary["phase"].get<std::string>(), "complete");
  ASSERT_EQ(summary["workers"].size(), 2u);
  int64_t pushed_bytes = 0;
  for (const auto& w : summary["workers"]) {
    EXPECT_EQ(w["rounds_contributed"].get<int64_t>(), 3) << w.dump();  // both contributed to every round
    EXPECT_EQ(w["state"].get<std::string>(), "left") << w.dump();
    EXPECT_EQ(w["tokens"].get<int64_t>(), 3 * 10 * 8 * 32) << w.dump();  // rounds x H x batch x seq_len
    pushed_bytes += w["bytes_pushed"].get<int64_t>();
  }
  EXPECT_EQ(summary["bytes_received"].get<int64_t>(), pushed_bytes);
  EXPECT_EQ(pushed_bytes, 2 * 3 * 4 * summary["params"].get<int64_t>());  // fp32 pseudo-gradients
  // Data parallel: per worker and inner step, ring all-reduce sends 2 (k-1)/k x 4 bytes x params (k = 2).
  EXPECT_EQ(summary["dp_equivalent_bytes"].get<int64_t>(), 2 * 3 * 10 * 4 * summary["params"].get<int64_t>());
  for (const auto& w : summary["workers"]) {
    EXPECT_GE(w["bytes_pulled"].get<int64_t>(), 3 * 4 * summary["params"].get<int64_t>()) << w.dump();
  }

  const auto& evals = summary["evals"];
  ASSERT_EQ(evals.size(), 4u);  // before round 1, then after rounds 1, 2, 3
  EXPECT_EQ(evals.front()["round"].get<int64_t>(), 0);
  EXPECT_EQ(evals.back()["round"].get<int64_t>(), 3);
  EXPECT_LT(evals.back()["val_loss"].get<double>(), evals.front()["val_loss"].get<double>() - 0.2);
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/ckpt-00000003.bin"));
}

TEST(Run, WorkerStartedBeforeCoordinatorWaitsAndConnects) {
  const std::string dir = ScratchDir("worker_first");
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  const std::vector<std::string> overrides = {"coordinator.listen=" + address, "coordinator.min_workers=1",
                                              "workers.count=1", "outer.rounds=1"};
  RunningProcess worker("diloco-worker", With(TinyArgs(dir, overrides), {"--coordinator", address, "--id", "early"}));
  ASSERT_TRUE(worker.WaitForOutput("waiting for coordinator", 60)) << worker.output();
  // The line says why at once (before, only the give-up after workers.connect_timeout_s did).
  EXPECT_NE(worker.output().find("waiting for coordinator " + address + " ("), std::string::npos) << worker.output();
  EXPECT_NE(worker.output().find("Connection refused); retrying for workers.connect_timeout_s = 60 s"),
            std::string::npos)
      << worker.output();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ASSERT_TRUE(worker.Running()) << worker.output();

  RunningProcess coordinator("diloco-coordinator", TinyArgs(dir, overrides));
  ASSERT_EQ(worker.Wait(120), 0) << worker.output();
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  ASSERT_EQ(summary["workers"].size(), 1u);
  EXPECT_EQ(summary["workers"][0]["id"].get<std::string>(), "early");
  EXPECT_EQ(summary["workers"][0]["rounds_contributed"].get<int64_t>(), 1);
}

TEST(Run, WorkerWithDifferentModelIsRefusedAtJoinNamingTheKey) {
  const std::string dir = ScratchDir("mismatch");
  RunningProcess coordinator("diloco-coordinator", With(TinyArgs(dir), {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();

  RunningProcess worker("diloco-worker",
                        With(TinyArgs(dir, {"model.d_model=64"}), {"--coordinator", address, "--id", "odd"}));
  EXPECT_EQ(worker.Wait(60), 3) << worker.output();
  EXPECT_NE(worker.output().find("model.d_model: worker has 64, coordinator has 32"), std::string::npos)
      << worker.output();
  coordinator.Signal(SIGTERM);
  EXPECT_EQ(coordinator.Wait(30), 130) << coordinator.output();
}

// A worker whose comm.chunk_bytes makes chunks the coordinator cannot receive is stopped right after its Join (exit
// 2, both values and the --set that fixes it) and leaves at once, before it trains a round; before, it trained a
// round and its push was refused. One with another inner.steps and outer.rounds trains, warned that its
// pseudo-gradients are of another H and that its learning-rate schedule follows its own rounds.
TEST(Run, WorkerWithChunksTooLargeStopsAfterItsJoinAndAnotherHOrRoundsIsWarned) {
  const std::string dir = ScratchDir("join_settings_mismatch");
  const std::vector<std::string> run = {"workers.count=1", "coordinator.min_workers=1", "outer.rounds=2"};
  RunningProcess coordinator("diloco-coordinator", With(TinyArgs(dir, run), {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();

  RunningProcess big("diloco-worker", With(TinyArgs(dir, run), {"--set", "comm.chunk_bytes=8388608", "--coordinator",
                                                                address, "--id", "big"}));
  EXPECT_EQ(big.Wait(60), 2) << big.output();
  EXPECT_NE(big.output().find("comm.chunk_bytes: this worker's 8388608 and the coordinator's "), std::string::npos)
      << big.output();
  EXPECT_NE(big.output().find("its pushes would exceed"), std::string::npos) << big.output();
  EXPECT_EQ(big.output().find("round 1:"), std::string::npos) << "it trained: " << big.output();
  EXPECT_TRUE(coordinator.WaitForOutput("left: worker big", 30)) << coordinator.output();

  RunningProcess other("diloco-worker", With(TinyArgs(dir, run), {"--set", "inner.steps=20", "--set", "outer.rounds=3",
                                                                  "--coordinator", address, "--id", "other"}));
  EXPECT_EQ(other.Wait(120), 0) << other.output();
  EXPECT_NE(other.output().find("inner.steps: the coordinator's run trains 10 inner steps a round and this worker's "
                                "config 20"),
            std::string::npos)
      << other.output();
  EXPECT_NE(other.output().find("outer.rounds: the coordinator's run has 2 rounds and this worker's config 3"),
            std::string::npos)
      << other.output();
  EXPECT_EQ(coordinator.Wait(60), 0) << coordinator.output();
}

// A worker whose tokenizer differs from the coordinator's (trained on other text: the same token id stands for
// another piece) is refused at Join with the line that names both vocabulary digests (exit 3), before it trains a
// round; one with another data.split likewise. Before, both trained: the first on ids the coordinator's validation
// data means otherwise, the second on shards that overlap the other workers'.
TEST(Run, AWorkerWithAnotherTokenizerOrDataSplitIsRefusedAtJoin) {
  const std::string dir = ScratchDir("join_data_mismatch");
  const std::vector<std::string> run = {"workers.count=1", "coordinator.min_workers=1", "outer.rounds=2"};
  RunningProcess coordinator("diloco-coordinator", With(TinyArgs(dir, run), {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();

  std::string upper = ReadFile(SourceDir() + "/tests/data/tinyshakespeare.txt");
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  std::ofstream(dir + "/upper.txt") << upper;
  // Its own token cache (the shared one's key has the text's mtime: each run would add a directory to it).
  RunningProcess other_text("diloco-worker", With(TinyArgs(dir, run), {"--set", "data.text=" + dir + "/upper.txt",
                                                                       "--set", "data.cache_dir=" + dir + "/cache",
                                                                       "--coordinator", address, "--id", "upper"}));
  EXPECT_EQ(other_text.Wait(120), 3) << other_text.output();
  EXPECT_NE(other_text.output().find("data differs from the coordinator's: the tokenizer: worker's vocabulary digest "
                                     "is "),
            std::string::npos)
      << other_text.output();
  EXPECT_NE(other_text.output().find("give every process the same data.tokenizer file"), std::string::npos)
      << other_text.output();
  EXPECT_EQ(other_text.output().find("round 1:"), std::string::npos) << "it trained: " << other_text.output();

  RunningProcess split("diloco-worker", With(TinyArgs(dir, run), {"--set", "data.split=contiguous", "--coordinator",
                                                                  address, "--id", "split"}));
  EXPECT_EQ(split.Wait(60), 3) << split.output();
  EXPECT_NE(split.output().find("data.split: worker has contiguous, coordinator has iid"), std::string::npos)
      << split.output();
  EXPECT_EQ(coordinator.output().find("joined: worker"), std::string::npos) << coordinator.output();

  RunningProcess same("diloco-worker", With(TinyArgs(dir, run), {"--coordinator", address, "--id", "same"}));
  EXPECT_EQ(same.Wait(120), 0) << same.output();
  EXPECT_EQ(coordinator.Wait(60), 0) << coordinator.output();
}

TEST(Run, BadConfigIsOneClearLineAndExit2) {
  const std::string dir = ScratchDir("bad_config");
  RunningProcess unknown("diloco-coordinator", TinyArgs(dir, {"inner.lrr=0.1"}));
  EXPECT_EQ(unknown.Wait(30), 2);
  EXPECT_NE(unknown.output().find("unknown key 'inner.lrr'"), std::string::npos) << unknown.output();

  RunningProcess missing("diloco-worker",
                         {"--config", dir + "/nope.yaml", "--coordinator", "127.0.0.1:1", "--id", "x"});
  EXPECT_EQ(missing.Wait(30), 2);
  EXPECT_NE(missing.output().find(dir + "/nope.yaml"), std::string::npos) << missing.output();

  RunningProcess no_text("diloco-launch",
                         With({SourceDir() + "/config/tiny.yaml"},
                              {"--set", "run.output_dir=" + dir, "--set", "data.text=" + dir + "/x.txt"}));
  EXPECT_EQ(no_text.Wait(30), 2);
  EXPECT_NE(no_text.output().find("data.text"), std::string::npos) << no_text.output();
}

TEST(Run, ProcessesStartingTogetherTokenizeOnce) {
  const std::string dir = ScratchDir("tokenize_once");
  const std::string port = std::to_string(FreePort());
  const std::vector<std::string> overrides = {"data.cache_dir=" + dir + "/cache",
                                              "coordinator.listen=127.0.0.1:" + port, "outer.rounds=1"};
  std::vector<std::string> args = TinyArgs(dir, overrides);
  RunningProcess coordinator("diloco-coordinator", args);
  RunningProcess w0("diloco-worker", With(args, {"--coordinator", "127.0.0.1:" + port, "--id", "w0"}));
  RunningProcess w1("diloco-worker", With(args, {"--coordinator", "127.0.0.1:" + port, "--id", "w1"}));
  ASSERT_EQ(w0.Wait(120), 0) << w0.output();
  ASSERT_EQ(w1.Wait(120), 0) << w1.output();
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  int tokenizer_runs = 0;
  for (const std::string& out : {coordinator.output(), w0.output(), w1.output()}) {
    for (size_t at = out.find("diloco-tokenize: "); at != std::string::npos;
         at = out.find("diloco-tokenize: ", at + 1)) {
      ++tokenizer_runs;
    }
  }
  EXPECT_EQ(tokenizer_runs, 1);
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// data.tokenizer: the token cache tokenizes with the given SentencePiece model (a Llama checkpoint's, say) instead of
// training one: the cache holds that very model, its own key, and ids below that model's size; a tokenizer with more
// pieces than model.vocab_size is refused.
TEST(Run, GivenTokenizerIsUsedInsteadOfTrainingOne) {
  const std::string dir = ScratchDir("given_tokenizer");
  const std::string text = SourceDir() + "/tests/data/tinyshakespeare.txt";
  RunningProcess made("diloco-tokenize",
                      {"--text", text, "--vocab-size", "100", "--val-fraction", "0.1", "--out", dir + "/made"});
  ASSERT_EQ(made.Wait(120), 0) << made.output();
  const std::string model = dir + "/made/tokenizer.model";
  auto config = ParseConfig("model: {vocab_size: 128}\n", "test",
                            {"data.text=" + text, "data.cache_dir=" + dir + "/cache", "data.tokenizer=" + model});
  ASSERT_TRUE(config.ok()) << config.status();
  auto cache = EnsureTokenized(*config, BinDir() + "/diloco-tokenize");
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ(ReadBytes(cache->tokenizer_model_path()), ReadBytes(model));
  const std::string train = ReadBytes(cache->train_path());
  ASSERT_GT(train.size(), 24u + 2 * 1000);
  uint16_t max_id = 0;
  for (size_t at = 24; at + 1 < train.size(); at += 2) {
    max_id = std::max<uint16_t>(max_id, static_cast<uint8_t>(train[at]) | static_cast<uint8_t>(train[at + 1]) << 8);
  }
  EXPECT_LT(max_id, 100);  // the given model's ids (a trained one would use up to 127)
  EXPECT_GT(max_id, 50);
  config->data.tokenizer.clear();
  auto trained = LocateTokenCache(*config);
  ASSERT_TRUE(trained.ok());
  EXPECT_NE(trained->dir, cache->dir);  // the cache key tells the two apart

  auto small = ParseConfig("model: {vocab_size: 64, d_model: 64}\n", "test",
                           {"data.text=" + text, "data.cache_dir=" + dir + "/cache", "data.tokenizer=" + model});
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_FALSE(EnsureTokenized(*small, BinDir() + "/diloco-tokenize").ok());
}

TEST(Run, InitFromCheckpointStartsFromThoseParameters) {
  const std::string first = ScratchDir("init_from_a");
  const std::vector<std::string> one_worker = {"coordinator.min_workers=1", "workers.count=1", "outer.rounds=2"};
  {
    RunningProcess coordinator("diloco-coordinator",
                               With(TinyArgs(first, one_worker), {"--port-file", first + "/addr"}));
    const std::string address = WaitForAddress(coordinator, first + "/addr");
    ASSERT_FALSE(address.empty()) << coordinator.output();
    RunningProcess worker("diloco-worker", With(TinyArgs(first, one_worker), {"--coordinator", address, "--id", "a"}));
    ASSERT_EQ(worker.Wait(120), 0) << worker.output();
    ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  }
  const double trained_loss = ReadJson(first + "/summary.json")["evals"].back()["val_loss"].get<double>();

  // A second run from that checkpoint evaluates theta_0 to the same loss (same parameters, same validation batches).
  const std::string second = ScratchDir("init_from_b");
  std::vector<std::string> overrides = one_worker;
  overrides.push_back("model.init_from=" + first + "/checkpoints/ckpt-00000002.bin");
  overrides.push_back("outer.rounds=1");
  RunningProcess coordinator("diloco-coordinator",
                             With(TinyArgs(second, overrides), {"--port-file", second + "/addr"}));
  const std::string address = WaitForAddress(coordinator, second + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();
  RunningProcess worker("diloco-worker", With(TinyArgs(second, overrides), {"--coordinator", address, "--id", "b"}));
  ASSERT_EQ(worker.Wait(120), 0) << worker.output();
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  const auto evals = ReadJson(second + "/summary.json")["evals"];
  EXPECT_NEAR(evals.front()["val_loss"].get<double>(), trained_loss, 1e-9);

  // A checkpoint of another model is refused with a clear line.
  RunningProcess wrong("diloco-coordinator",
                       TinyArgs(ScratchDir("init_from_c"),
                                {"model.init_from=" + first + "/checkpoints/ckpt-00000002.bin", "model.d_model=64"}));
  EXPECT_EQ(wrong.Wait(60), 2);
  EXPECT_NE(wrong.output().find("model.init_from"), std::string::npos) << wrong.output();
}

// Runs config/tiny.yaml through the launcher with `overrides`; returns its summary.
// With `output`, also returns what the launcher and its processes printed.
nlohmann::json LaunchTiny(const std::string& name, const std::vector<std::string>& overrides,
                          std::string* output = nullptr) {
  const std::string dir = ScratchDir(name);
  std::vector<std::string> args = TinyArgs(dir, overrides);
  args.erase(args.begin());  // the launcher takes the config as a positional argument
  RunningProcess launch("diloco-launch", args);
  EXPECT_EQ(launch.Wait(240), 0) << launch.output();
  if (output != nullptr) *output = launch.output();
  return ReadJson(dir + "/summary.json");
}

// comm.transport tcp: the same run with pushes framed on a plain TCP connection ends where the gRPC run ends (same
// pseudo-gradients, same accounting); the coordinator says where it listens, both workers push there, and no push
// fell back to gRPC.
TEST(Launch, TcpTransportTrainsLikeGrpc) {
  const std::vector<std::string> common = {"outer.rounds=3", "inner.steps=20", "model.n_layer=2"};
  const nlohmann::json grpc = LaunchTiny("transport_grpc", With(common, {"comm.transport=grpc"}));
  std::string output;
  const nlohmann::json tcp = LaunchTiny("transport_tcp", With(common, {"comm.transport=tcp"}), &output);
  EXPECT_NE(output.find("pushes over tcp on 127.0.0.1:"), std::string::npos) << output;
  for (const std::string worker : {"[worker-0] ", "[worker-1] "}) {
    bool tcp_join = false;
    std::istringstream lines(output);
    for (std::string line; std::getline(lines, line);) {
      tcp_join = tcp_join || (line.rfind(worker, 0) == 0 && line.find("pushes over tcp to port") != std::string::npos);
    }
    EXPECT_TRUE(tcp_join) << worker << "never joined with a TCP push port\n" << output;
  }
  EXPECT_EQ(output.find("pushing over gRPC"), std::string::npos) << output;
  const double loss_grpc = grpc["evals"].back()["val_loss"], loss_tcp = tcp["evals"].back()["val_loss"];
  std::cout << "[measure] val_loss grpc " << loss_grpc << ", tcp " << loss_tcp << std::endl;
  EXPECT_LT(loss_tcp, tcp["evals"].front()["val_loss"].get<double>() - 0.3);
  // Two workers' pushes are summed in arrival order on both transports: equal up to float rounding.
  EXPECT_NEAR(loss_tcp, loss_grpc, 1e-4 * loss_grpc);
  EXPECT_EQ(tcp["round"], 3);
  EXPECT_EQ(tcp["bytes_pushed_committed"], grpc["bytes_pushed_committed"]);
  for (const auto& w : tcp["workers"]) EXPECT_EQ(w["rounds_contributed"], 3) << w.dump();
}

// outer.aggregation clip over comm.transport tcp: the first pushes of a round are answered UNAVAILABLE ("waiting for
// the round's other push headers") until every header is in. That is the coordinator's answer, not a broken
// connection: the worker pushes again over TCP. It used to drop TCP for gRPC until its next join, at the first round.
TEST(Launch, ClipsRetryAnswerKeepsTheTcpTransport) {
  std::string output;
  const nlohmann::json tcp =
      LaunchTiny("transport_tcp_clip", {"outer.rounds=2", "comm.transport=tcp", "outer.aggregation=clip"}, &output);
  EXPECT_NE(output.find("clip fold open with 2 pushes declared"), std::string::npos) << output;
  EXPECT_EQ(output.find("pushing over gRPC"), std::string::npos) << output;
  EXPECT_EQ(tcp["round"], 2);
}

namespace {
// A raw connection to the coordinator's TCP push port.
int ConnectTo(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}
std::string U32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
}  // namespace

// Hostile input on the TCP push port: garbage, a wrong token, a lying frame length, a push from a stranger and a
// push cut off mid-payload each get one log line (or a refusal answer) and change nothing; a real worker then
// trains the run to its end.
TEST(Run, TcpPushPortRefusesBadConnectionsAndTheRunGoesOn) {
  const std::string dir = ScratchDir("tcp_hostile");
  {
    std::ofstream token(dir + "/token");
    token << "right-token\n";
  }
  const auto args = TinyArgs(dir, {"comm.transport=tcp", "coordinator.min_workers=1", "outer.rounds=2",
                                   "security.token_file=" + dir + "/token"});
  RunningProcess coordinator("diloco-coordinator", With(args, {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();
  ASSERT_TRUE(coordinator.WaitForOutput("pushes over tcp on 127.0.0.1:", 30)) << coordinator.output();
  const std::string out = coordinator.output();
  const size_t at = out.find("pushes over tcp on 127.0.0.1:") + std::string("pushes over tcp on 127.0.0.1:").size();
  const int port = std::stoi(out.substr(at));

  auto send_and_close = [&](const std::string& bytes, bool read_answer = false) {
    const int fd = ConnectTo(port);
    EXPECT_TRUE(WriteAll(fd, bytes.data(), bytes.size()).ok());
    absl::StatusOr<PushReply> answer;
    absl::Status io = absl::OkStatus();
    if (read_answer) io = ReadPushResult(fd, &answer);
    close(fd);
    return std::make_pair(io, answer.status());
  };
  send_and_close("GET / HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(coordinator.WaitForOutput("refused: not a push connection", 30)) << coordinator.output();

  const std::string hello_wrong = U32(kPushFramesMagic) + U32(kPushFramesVersion) + U32(5) + "wrong";
  auto [io, answer] = send_and_close(hello_wrong, /*read_answer=*/true);
  ASSERT_TRUE(io.ok()) << io;
  EXPECT_EQ(answer.code(), absl::StatusCode::kUnauthenticated) << answer;
  ASSERT_TRUE(coordinator.WaitForOutput("refused: wrong token", 30)) << coordinator.output();

  const std::string hello = U32(kPushFramesMagic) + U32(kPushFramesVersion) + U32(11) + "right-token";
  send_and_close(hello + U32(0x7fffffff));
  ASSERT_TRUE(coordinator.WaitForOutput("message of 2147483647 bytes", 30)) << coordinator.output();

  PushMessage stranger;
  stranger.mutable_header()->mutable_meta()->set_worker_id("stranger");
  stranger.mutable_header()->set_tokens(100);
  const std::string stranger_frame =
      U32(static_cast<uint32_t>(stranger.ByteSizeLong())) + stranger.SerializeAsString() + std::string(8, '\0');
  std::tie(io, answer) = send_and_close(hello + stranger_frame + U32(0), /*read_answer=*/true);
  ASSERT_TRUE(io.ok()) << io;
  EXPECT_FALSE(answer.ok()) << "a push from a non-member must be refused";

  PushMessage chunk;
  chunk.mutable_chunk()->set_name("tok_emb.weight");
  uint64_t big = 4096;
  send_and_close(hello + stranger_frame + U32(static_cast<uint32_t>(chunk.ByteSizeLong())) + chunk.SerializeAsString() +
                 std::string(reinterpret_cast<const char*>(&big), 8) + "cut");
  ASSERT_TRUE(coordinator.WaitForOutput("connection lost reading a chunk's payload", 30)) << coordinator.output();

  RunningProcess w0("diloco-worker", With(args, {"--coordinator", address, "--id", "w0"}));
  ASSERT_EQ(w0.Wait(120), 0) << w0.output();
  EXPECT_NE(w0.output().find("pushes over tcp to port " + std::to_string(port)), std::string::npos) << w0.output();
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  EXPECT_EQ(summary["round"], 2);
  ASSERT_EQ(summary["workers"].size(), 1u) << summary.dump();
  EXPECT_EQ(summary["workers"][0]["rounds_contributed"], 2);
  EXPECT_EQ(summary["bytes_pushed_committed"].get<int64_t>(), 2 * 4 * summary["params"].get<int64_t>());
}

// Issue 4's acceptance: int8 pseudo-gradients, and Streaming DiLoCo (2 fragments, 2 overlapped steps), each end
// within 2% of the fp32 run's validation loss on the same seed and inner steps; for our gpt and for llama (grouped-
// query attention, untied head: its lm_head is the last fragment's).
class ArchLaunch : public ::testing::TestWithParam<std::string> {};

TEST_P(ArchLaunch, Int8AndStreamingFragmentsReachTheFp32Loss) {
  std::vector<std::string> common = {"outer.rounds=4", "inner.steps=30", "model.n_layer=2"};
  if (GetParam() == "llama") {
    common.insert(common.end(), {"model.arch=llama", "model.n_kv_head=1", "model.tie_embeddings=false"});
  }
  auto with = [&](const std::vector<std::string>& more) { return With(common, more); };
  const std::string arch = GetParam();
  const nlohmann::json fp32 = LaunchTiny(arch + "_codec_fp32", with({"comm.codec=fp32"}));
  const nlohmann::json int8 = LaunchTiny(arch + "_codec_int8", with({"comm.codec=int8", "comm.error_feedback=true"}));
  const nlohmann::json streaming =
      LaunchTiny(arch + "_streaming", with({"comm.fragments=2", "comm.overlap_steps=2", "comm.merge_alpha=0.5"}));
  const double loss32 = fp32["evals"].back()["val_loss"], loss8 = int8["evals"].back()["val_loss"];
  const double loss_streaming = streaming["evals"].back()["val_loss"];
  std::cout << "[measure] val_loss fp32 " << loss32 << ", int8 " << loss8 << ", fragments 2 overlap 2 "
            << loss_streaming << "; bytes pushed fp32 " << fp32["bytes_pushed_committed"] << ", int8 "
            << int8["bytes_pushed_committed"] << ", streaming " << streaming["bytes_pushed_committed"]
            << "; bytes of the last round fp32 " << fp32["last_round_bytes_pushed"] << ", streaming "
            << streaming["last_round_bytes_pushed"] << std::endl;
  EXPECT_LT(loss32, fp32["evals"].front()["val_loss"].get<double>() - 0.5);
  EXPECT_NEAR(loss8, loss32, 0.02 * loss32);
  EXPECT_LE(int8["bytes_pushed_committed"].get<double>(), 0.27 * fp32["bytes_pushed_committed"].get<double>());

  // Streaming: 4 outer rounds are 8 fragment syncs, each worker took part in all of them, every push carried one
  // fragment (less than the whole model), and over the run the same amount was sent as with fp32 DiLoCo.
  EXPECT_NEAR(loss_streaming, loss32, 0.02 * loss32);
  EXPECT_EQ(streaming["rounds_total"], 8);
  EXPECT_EQ(streaming["fragments"], 2);
  for (const auto& w : streaming["workers"]) EXPECT_EQ(w["rounds_contributed"], 8) << w.dump();
  EXPECT_LT(streaming["last_round_bytes_pushed"].get<double>(), 0.8 * fp32["last_round_bytes_pushed"].get<double>());
  EXPECT_EQ(streaming["bytes_pushed_committed"], fp32["bytes_pushed_committed"]);
  EXPECT_EQ(streaming["dp_equivalent_bytes"], fp32["dp_equivalent_bytes"]);
}

INSTANTIATE_TEST_SUITE_P(Archs, ArchLaunch, ::testing::Values("gpt", "llama"));

// Launching a finished run again resumes it, sees it complete, and the workers learn so and exit 0 at once
// (instead of retrying a coordinator that already left); with --fresh it starts over, workers included.
TEST(Launch, RelaunchOfACompletedRunEndsCleanly) {
  const std::string dir = ScratchDir("relaunch");
  std::vector<std::string> args = TinyArgs(dir);
  args.erase(args.begin());
  {
    RunningProcess first("diloco-launch", args);
    ASSERT_EQ(first.Wait(180), 0) << first.output();
  }
  RunningProcess again("diloco-launch", args);
  ASSERT_EQ(again.Wait(60), 0) << again.output();
  const std::string out = again.output();
  EXPECT_NE(out.find("is already complete (round 3 of 3)"), std::string::npos) << out;
  EXPECT_NE(out.find("[worker-0] "), std::string::npos);
  EXPECT_EQ(out.find("exited with code"), std::string::npos) << out;
  EXPECT_NE(out.find("[launch] done: 3 rounds"), std::string::npos) << out;
  // --fresh starts the run over, the workers included: none resumes (or even reads) the moments and data position
  // its last run saved in workers.state_dir (before, each resumed them, or warned that its shard differed).
  // Two rounds this time: the first run's checkpoints (rounds 1-3, newer names) are moved aside, so the new run's
  // are the ones kept (before, each was pruned as soon as it was written, the oldest name of four) and the next
  // launch resumes the new run, not the old one.
  std::vector<std::string> fresh_args = args;
  fresh_args.insert(fresh_args.end(), {"--fresh", "--set", "outer.rounds=2"});
  RunningProcess fresh("diloco-launch", fresh_args);
  ASSERT_EQ(fresh.Wait(180), 0) << fresh.output();
  const std::string restarted = fresh.output();
  EXPECT_NE(restarted.find("[launch] done: 2 rounds"), std::string::npos) << restarted;
  EXPECT_NE(restarted.find("--fresh: not resuming the saved state"), std::string::npos) << restarted;
  EXPECT_NE(restarted.find("--fresh: the earlier run's checkpoints in"), std::string::npos) << restarted;
  EXPECT_EQ(restarted.find("resuming from"), std::string::npos) << restarted;
  EXPECT_EQ(restarted.find("ignoring the saved state"), std::string::npos) << restarted;
  std::vector<std::string> kept, aside;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/checkpoints")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0) kept.push_back(name);
    if (name.rfind("before-fresh-", 0) == 0) {
      for (const auto& old : std::filesystem::directory_iterator(entry.path()))
        aside.push_back(old.path().filename().string());
    }
  }
  std::sort(kept.begin(), kept.end());
  std::sort(aside.begin(), aside.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"ckpt-00000001.bin", "ckpt-00000002.bin"}));
  EXPECT_EQ(aside, (std::vector<std::string>{"ckpt-00000001.bin", "ckpt-00000002.bin", "ckpt-00000003.bin"}));
  RunningProcess after("diloco-launch", With(args, {"--set", "outer.rounds=2"}));
  ASSERT_EQ(after.Wait(60), 0) << after.output();
  EXPECT_NE(after.output().find("is already complete (round 2 of 2)"), std::string::npos) << after.output();
}

// A --fresh start beside a coordinator still serving the run (the same port and checkpoint directory) fails and
// touches nothing: the directory is locked by the live coordinator (and tidied, leftover .tmp removed and old
// checkpoints moved aside, only once the port is this process's). Before, the live run's checkpoints were moved away
// by the start that then failed; and gRPC's default SO_REUSEPORT let the second coordinator bind the live one's port
// and serve beside it. On port 0 (the examples' listen) no port clash stops a second coordinator: the lock does
// (before, both ran and wrote their checkpoints and summary.json over each other's).
TEST(Launch, AFreshStartThatCannotListenLeavesTheCheckpointsAlone) {
  const std::string dir = ScratchDir("fresh_busy_port");
  const std::string listen = "coordinator.listen=127.0.0.1:" + std::to_string(FreePort());
  RunningProcess live("diloco-coordinator", TinyArgs(dir, {listen}));
  ASSERT_TRUE(live.WaitForOutput("listening on", 120)) << live.output();
  std::filesystem::create_directories(dir + "/checkpoints");
  std::ofstream(dir + "/checkpoints/ckpt-00000007.bin") << "the live run's";
  std::ofstream(dir + "/checkpoints/ckpt-00000008.bin.tmp") << "a save under way";
  const auto [code, output] = RunToEnd("diloco-coordinator", With(TinyArgs(dir, {listen}), {"--fresh"}));
  EXPECT_EQ(code, 2) << output;
  const std::string in_use = "coordinator.checkpoint_dir: " + dir +
                             "/checkpoints is in use by another coordinator (pid " + std::to_string(live.pid()) +
                             ", lock ";
  EXPECT_NE(output.find(in_use), std::string::npos) << output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/ckpt-00000007.bin")) << output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/ckpt-00000008.bin.tmp")) << output;
  EXPECT_EQ(output.find("before-fresh"), std::string::npos) << output;
  const auto [port0_code, port0] = RunToEnd("diloco-coordinator", TinyArgs(dir, {"coordinator.listen=127.0.0.1:0"}));
  EXPECT_EQ(port0_code, 2) << port0;
  EXPECT_NE(port0.find(in_use), std::string::npos) << port0;
  live.Signal(SIGTERM);
  EXPECT_EQ(live.Wait(60), 130) << live.output();
}

// The last round's checkpoint cannot be written (its .tmp path is a directory that is not empty): the coordinator
// tries three times, then exits 1 with a line saying so (before, it logged "training goes on" and exited 0 with
// theta_T on no disk), so the launch fails; the earlier checkpoint is there for a restart.
TEST(Launch, AFinalCheckpointThatCannotBeWrittenIsNotACleanEnd) {
  const std::string dir = ScratchDir("final_checkpoint");
  std::filesystem::create_directories(dir + "/checkpoints/ckpt-00000002.bin.tmp/in-the-way");
  std::vector<std::string> args = TinyArgs(dir, {"outer.rounds=2"});
  args.erase(args.begin());
  RunningProcess launch("diloco-launch", args);
  EXPECT_EQ(launch.Wait(180), 1) << launch.output();
  const std::string out = launch.output();
  EXPECT_NE(out.find("the final checkpoint failed (try 2 of 3; again in 2 s)"), std::string::npos) << out;
  EXPECT_NE(out.find("the run is complete but its final checkpoint could not be written"), std::string::npos) << out;
  EXPECT_NE(out.find("coordinator exited with code 1"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/ckpt-00000001.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/checkpoints/ckpt-00000002.bin"));
}

// A wrong flag is one line and exit code 2 in every binary (the code the systemd units keep from restarting), not
// CLI11's two lines and 105-109; --help still exits 0. The launcher's config is positional: --config is a wrong flag.
TEST(Launch, AWrongFlagIsOneLineAndExitCode2InEveryBinary) {
  const std::string tiny = SourceDir() + "/config/tiny.yaml";
  const std::vector<std::pair<std::string, std::vector<std::string>>> calls = {
      {"diloco-coordinator", {"--config", tiny}},
      {"diloco-worker", {"--config", tiny, "--coordinator", "127.0.0.1:1", "--id", "w"}},
      {"diloco-launch", {tiny}},
      {"diloco-ctl", {"status", "--addr", "127.0.0.1:1"}},
      {"diloco-tokenize", {"encode", "--model", "m", "--text", "t"}}};
  for (const auto& [binary, args] : calls) {
    const auto [code, output] = RunToEnd(binary, With(args, {"--no-such-flag"}));
    EXPECT_EQ(code, 2) << binary << ": " << output;
    EXPECT_EQ(output, binary +
                          ": error: The following argument was not expected: --no-such-flag; --help lists the "
                          "flags\n");
    EXPECT_EQ(RunToEnd(binary, {"--help"}).first, 0) << binary;
  }
  const auto [code, output] = RunToEnd("diloco-launch", {"--config", tiny});
  EXPECT_EQ(code, 2) << output;
  EXPECT_NE(output.find("diloco-launch: error: "), std::string::npos) << output;
  // diloco-ctl status --watch --interval 0 polled the coordinator in a busy loop.
  const auto [watch_code, watch] =
      RunToEnd("diloco-ctl", {"status", "--addr", "127.0.0.1:1", "--watch", "--interval", "0"});
  EXPECT_EQ(watch_code, 2) << watch;
  EXPECT_EQ(watch, "diloco-ctl: error: --interval: must be a number of seconds > 0, got 0; --help lists the flags\n");
  // An address without its port: gRPC dialled port 0 (the worker) or 443 (ctl) and waited for a reason it never said.
  const auto [worker_code, worker] =
      RunToEnd("diloco-worker", {"--config", tiny, "--coordinator", "127.0.0.1", "--id", "w"});
  EXPECT_EQ(worker_code, 2) << worker;
  EXPECT_EQ(worker,
            "diloco-worker: error: --coordinator: must be HOST:PORT with a port in 1..65535, got 127.0.0.1; --help "
            "lists the flags\n");
  const auto [addr_code, addr] = RunToEnd("diloco-ctl", {"status", "--addr", "localhost"});
  EXPECT_EQ(addr_code, 2) << addr;
  EXPECT_EQ(addr,
            "diloco-ctl: error: --addr: must be HOST:PORT with a port in 1..65535, got localhost; --help lists "
            "the flags\n");
}

// The launcher starts workers.count workers: a min_workers above it could never close a round (the launch waited
// forever); --check-config says so.
TEST(Launch, MinWorkersAboveTheWorkersItStartsIsAConfigError) {
  const auto [code, output] =
      RunToEnd("diloco-launch", {SourceDir() + "/config/tiny.yaml", "--set", "workers.count=1", "--check-config"});
  EXPECT_EQ(code, 2) << output;
  EXPECT_NE(output.find("coordinator.min_workers (2) is more than workers.count (1)"), std::string::npos) << output;
}

// --check-config looks for the input files the launch would read first: a misspelled data.text is a warning with the
// line the launch itself would print (not an error: a config is often checked where its files are not, as in the
// image's build stage). Before, it said "config OK" alone and the launch then failed.
TEST(Launch, CheckConfigChecksTheInputFiles) {
  const auto [code, output] =
      RunToEnd("diloco-launch", {SourceDir() + "/config/tiny.yaml", "--set",
                                 "data.text=" + SourceDir() + "/tests/data/tinyshakespear.txt", "--check-config"});
  EXPECT_EQ(code, 0) << output;
  EXPECT_NE(output.find("config OK"), std::string::npos) << output;
  EXPECT_NE(output.find("diloco-launch: warning: data.text: cannot read '"), std::string::npos) << output;
  EXPECT_NE(output.find("(here; a launch here would stop there)"), std::string::npos) << output;
}

TEST(Launch, TinyRunEndsWithExit0AndPrefixedLogs) {
  const std::string dir = ScratchDir("launch");
  std::vector<std::string> args = TinyArgs(dir);
  args.erase(args.begin());  // the launcher takes the config as a positional argument
  RunningProcess launch("diloco-launch", args);
  ASSERT_EQ(launch.Wait(180), 0) << launch.output();
  const std::string out = launch.output();
  EXPECT_NE(out.find("[coordinator] "), std::string::npos);
  EXPECT_NE(out.find("[worker-0] "), std::string::npos);
  EXPECT_NE(out.find("[worker-1] "), std::string::npos);
  EXPECT_NE(out.find("[launch] done: 3 rounds"), std::string::npos) << out;
}

TEST(Launch, InterruptStopsEveryChild) {
  const std::string dir = ScratchDir("launch_interrupt");
  std::vector<std::string> args = TinyArgs(dir, {"outer.rounds=1000"});
  args.erase(args.begin());
  RunningProcess launch("diloco-launch", args);
  ASSERT_TRUE(launch.WaitForOutput("round 2/1000 closed", 120)) << launch.output();
  launch.Signal(SIGINT);
  EXPECT_EQ(launch.Wait(30), 130) << launch.output();
  // The launcher reaps every child before it exits; the coordinator no longer answers.
  RunningProcess ctl("diloco-ctl",
                     {"status", "--addr",
                      ReadFile(dir + "/coordinator.addr").substr(0, ReadFile(dir + "/coordinator.addr").find('\n')),
                      "--timeout", "2"});
  EXPECT_NE(ctl.Wait(30), 0) << "the coordinator still answers after the launcher stopped";
  const std::string out = launch.output();
  EXPECT_NE(out.find("stopping workers and coordinator"), std::string::npos) << out;
  EXPECT_EQ(out.find("did not stop in 10 s"), std::string::npos) << out;
}

}  // namespace
}  // namespace diloco::testing
