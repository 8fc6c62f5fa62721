// Memory under hostile traffic (issue 19), end to end against a real diloco-coordinator with the defaults
// (config/tiny.yaml on 127.0.0.1, no token; coordinator.grpc_memory_quota_mb 32): oversize push messages from a raw
// gRPC client (no Join) grow the coordinator's peak RSS (VmHWM, /proc/PID/status) by at most 64 MiB and are refused,
// and the coordinator still answers GetStatus with the same model. With the quota off
// (coordinator.grpc_memory_quota_mb=0) the same messages grew it by +275 / +325 MiB, so these tests fail there.
// (Bounded ids, status size and echo: hostile_input_test.cc.)
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "proto/diloco.grpc.pb.h"
#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

constexpr int64_t kMiB = 1 << 20;

std::unique_ptr<Coordinator::Stub> RawStub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetMaxReceiveMessageSize(-1);
  // A channel of its own per stub (a distinct argument keeps gRPC from sharing one subchannel between them).
  static int n = 0;
  args.SetInt("diloco.test.channel", ++n);
  return Coordinator::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

template <typename Request>
void Deadline(grpc::ClientContext* ctx, int seconds = 60) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

grpc::Status GetStatus(Coordinator::Stub& stub, StatusReply* reply) {
  grpc::ClientContext ctx;
  Deadline<StatusRequest>(&ctx);
  return stub.GetStatus(&ctx, StatusRequest(), reply);
}

// One push stream of a single message: a chunk of `bytes` of data (no Join, no header: gRPC or the service must
// refuse it).
grpc::Status PushOversize(const std::string& address, const PushMessage& message) {
  auto stub = RawStub(address);
  grpc::ClientContext ctx;
  Deadline<PushMessage>(&ctx, 120);
  PushReply reply;
  auto writer = stub->PushPseudoGradient(&ctx, &reply);
  writer->Write(message);
  writer->WritesDone();
  return writer->Finish();
}

PushMessage BigChunk(int64_t bytes) {
  PushMessage m;
  TensorChunk* c = m.mutable_chunk();
  c->set_name("wte");
  c->set_dtype(FLOAT32);
  c->add_shape(bytes / 4);
  c->set_count(bytes / 4);
  c->set_codec(CODEC_RAW);
  c->mutable_data()->assign(static_cast<size_t>(bytes), '\x01');
  return m;
}

struct CoordinatorProcess {
  explicit CoordinatorProcess(const std::string& name, std::vector<std::string> extra = {})
      : dir(ScratchDir(name)), process("diloco-coordinator", [&] {
          std::vector<std::string> args = TinyArgs(dir, std::move(extra));
          args.push_back("--port-file");
          args.push_back(dir + "/addr");
          return args;
        }()) {
    address = WaitForAddress(process, dir + "/addr");
  }
  std::string dir;
  RunningProcess process;
  std::string address;
};

// Grows the coordinator's VmHWM by at most 64 MiB: `streams` concurrent pushes of one `bytes` message each.
void ExpectBoundedGrowth(int streams, int64_t bytes) {
  CoordinatorProcess c("limits_memory_" + std::to_string(streams));
  ASSERT_FALSE(c.address.empty()) << c.process.output();
  auto stub = RawStub(c.address);
  StatusReply status;
  ASSERT_TRUE(GetStatus(*stub, &status).ok());
  const int64_t before_kb = VmHwmKb(c.process.pid());
  ASSERT_GT(before_kb, 0);
  const PushMessage message = BigChunk(bytes);
  std::vector<grpc::Status> results(static_cast<size_t>(streams));
  std::vector<std::thread> threads;
  for (int i = 0; i < streams; ++i) {
    threads.emplace_back([&, i] { results[static_cast<size_t>(i)] = PushOversize(c.address, message); });
  }
  for (std::thread& t : threads) t.join();
  const int64_t after_kb = VmHwmKb(c.process.pid());
  for (const grpc::Status& s : results) {
    EXPECT_FALSE(s.ok());
    std::cout << "[refused] " << s.error_code() << " " << s.error_message() << "\n";
  }
  std::cout << "[memory] " << streams << " x " << bytes / kMiB << " MiB: VmHWM " << before_kb / 1024 << " -> "
            << after_kb / 1024 << " MiB (+" << (after_kb - before_kb) / 1024 << " MiB)\n";
  EXPECT_LE(after_kb - before_kb, 64 * 1024) << "VmHWM grew from " << before_kb << " kB to " << after_kb << " kB";
  StatusReply after;
  grpc::Status s = GetStatus(*RawStub(c.address), &after);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(after.fingerprint(), status.fingerprint());
}

TEST(Limits, OneMessageOf256MiBGrowsPeakMemoryByAtMost64MiB) { ExpectBoundedGrowth(1, 256 * kMiB); }

TEST(Limits, EightConcurrentMessagesOf64MiBGrowPeakMemoryByAtMost64MiB) { ExpectBoundedGrowth(8, 64 * kMiB); }

}  // namespace
}  // namespace diloco::testing
