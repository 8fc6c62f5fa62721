// The framing of comm.transport tcp (proto/push_frames.h) over a real socketpair: frames round-trip with their
// payloads, the end-of-push frame and the result frame carry what was sent, and every broken limit or malformed
// part is refused with an error naming it, before anything large is allocated.
#include "proto/push_frames.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

namespace diloco {
namespace {

class PushFramesTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  void TearDown() override {
    if (fds_[0] >= 0) close(fds_[0]);
    if (fds_[1] >= 0) close(fds_[1]);
  }
  void Raw(const std::string& bytes) { ASSERT_TRUE(WriteAll(fds_[0], bytes.data(), bytes.size()).ok()); }
  void CloseWriter() {
    close(fds_[0]);
    fds_[0] = -1;
  }
  static std::string U32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
  static std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
  int fds_[2] = {-1, -1};
};

TEST_F(PushFramesTest, HelloFramesAndResultRoundTrip) {
  ASSERT_TRUE(WriteHello(fds_[0], "s3cret").ok());
  PushMessage header;
  header.mutable_header()->set_tokens(1234);
  header.mutable_header()->mutable_meta()->set_worker_id("w0");
  ASSERT_TRUE(WritePushFrame(fds_[0], header, nullptr, 0).ok());
  PushMessage chunk;
  chunk.mutable_chunk()->set_name("blocks.0.fc.weight");
  chunk.mutable_chunk()->set_offset(7);
  const std::string payload(100000, 'x');
  std::thread writer([&] {  // the payload is larger than the socket buffer: write while the test reads
    EXPECT_TRUE(WritePushFrame(fds_[0], chunk, payload.data(), payload.size()).ok());
    EXPECT_TRUE(WriteEndOfPush(fds_[0]).ok());
  });
  auto token = ReadHello(fds_[1]);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret");
  PushMessage got;
  std::string buffer;
  auto more = ReadPushFrame(fds_[1], &got, 1 << 20, &buffer);
  ASSERT_TRUE(more.ok() && *more) << more.status();
  ASSERT_TRUE(got.has_header());
  EXPECT_EQ(got.header().tokens(), 1234);
  EXPECT_EQ(got.header().meta().worker_id(), "w0");
  more = ReadPushFrame(fds_[1], &got, 1 << 20, &buffer);
  ASSERT_TRUE(more.ok() && *more) << more.status();
  ASSERT_TRUE(got.has_chunk());
  EXPECT_EQ(got.chunk().name(), "blocks.0.fc.weight");
  EXPECT_EQ(got.chunk().offset(), 7);
  EXPECT_EQ(got.chunk().data(), payload);
  more = ReadPushFrame(fds_[1], &got, 1 << 20, &buffer);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_FALSE(*more) << "the end-of-push frame";
  writer.join();

  PushReply reply;
  reply.set_round(3);
  ASSERT_TRUE(WritePushResult(fds_[0], absl::OkStatus(), reply).ok());
  ASSERT_TRUE(WritePushResult(fds_[0], absl::FailedPreconditionError("round 3 closed"), PushReply()).ok());
  absl::StatusOr<PushReply> answer;
  ASSERT_TRUE(ReadPushResult(fds_[1], &answer).ok());
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->round(), 3);
  ASSERT_TRUE(ReadPushResult(fds_[1], &answer).ok());
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(answer.status().message(), "round 3 closed");
}

TEST_F(PushFramesTest, WrongMagicVersionAndTokenLengthAreRefused) {
  Raw("GET / HTTP/1.1\r\n\r\n");
  auto hello = ReadHello(fds_[1]);
  EXPECT_EQ(hello.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(hello.status().message().find("not a push connection"), std::string::npos) << hello.status();
}

TEST_F(PushFramesTest, VersionAndTokenLimits) {
  Raw(U32(kPushFramesMagic) + U32(99));
  auto hello = ReadHello(fds_[1]);
  EXPECT_NE(hello.status().message().find("version 99"), std::string::npos) << hello.status();
  Raw(U32(kPushFramesMagic) + U32(kPushFramesVersion) + U32(1 << 30));
  hello = ReadHello(fds_[1]);
  EXPECT_NE(hello.status().message().find("token of 1073741824 bytes"), std::string::npos) << hello.status();
}

TEST_F(PushFramesTest, OversizedMalformedAndMisplacedPartsAreRefused) {
  PushMessage got;
  std::string buffer;
  Raw(U32(0xffffffffu));
  auto more = ReadPushFrame(fds_[1], &got, 1 << 20, &buffer);
  EXPECT_NE(more.status().message().find("message of 4294967295 bytes"), std::string::npos) << more.status();

  Raw(U32(5) + std::string("\xff\xff\xff\xff\xff", 5));
  more = ReadPushFrame(fds_[1], &got, 1 << 20, &buffer);
  EXPECT_NE(more.status().message().find("malformed PushMessage"), std::string::npos) << more.status();

  PushMessage with_data;
  with_data.mutable_chunk()->set_data("inline");
  Raw(U32(static_cast<uint32_t>(with_data.ByteSizeLong())) +
      with_data.SerializeAsString());  // refused before its length
  more = ReadPushFrame(fds_[1], &got, 1 << 20, &buffer);
  EXPECT_NE(more.status().message().find("must travel as the frame's payload"), std::string::npos) << more.status();

  PushMessage chunk;
  chunk.mutable_chunk()->set_name("w");
  Raw(U32(static_cast<uint32_t>(chunk.ByteSizeLong())) + chunk.SerializeAsString() + U64(uint64_t{1} << 40));
  more = ReadPushFrame(fds_[1], &got, 1 << 20, &buffer);
  EXPECT_NE(more.status().message().find("payload of 1099511627776 bytes (at most 1048576)"), std::string::npos)
      << more.status();

  PushMessage header;
  header.mutable_header()->set_tokens(1);
  Raw(U32(static_cast<uint32_t>(header.ByteSizeLong())) + header.SerializeAsString() + U64(4) + "abcd");
  more = ReadPushFrame(fds_[1], &got, 1 << 20, &buffer);
  EXPECT_NE(more.status().message().find("payload after a non-chunk message"), std::string::npos) << more.status();
}

TEST_F(PushFramesTest, ClosedAndTruncatedConnections) {
  PushMessage chunk;
  chunk.mutable_chunk()->set_name("w");
  Raw(U32(static_cast<uint32_t>(chunk.ByteSizeLong())) + chunk.SerializeAsString() + U64(1000) + "only ten b");
  CloseWriter();
  PushMessage got;
  std::string buffer;
  auto more = ReadPushFrame(fds_[1], &got, 1 << 20, &buffer);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(more.status().message().find("connection lost reading a chunk's payload (10 of 1000 bytes)"),
            std::string::npos)
      << more.status();
  more = ReadPushFrame(fds_[1], &got, 1 << 20, &buffer);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kNotFound) << "a clean close between frames: " << more.status();
}

}  // namespace
}  // namespace diloco
