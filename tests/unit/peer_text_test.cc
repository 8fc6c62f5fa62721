// Peer text rules (proto/peer_text.h): the worker id rule and the truncation of echoed input.
#include "proto/peer_text.h"

#include <gtest/gtest.h>

#include <string>

namespace diloco {
namespace {

TEST(PeerTextTest, WorkerIdsOfUpTo128AllowedCharactersAreAccepted) {
  EXPECT_TRUE(ValidateWorkerId("w0").ok());
  EXPECT_TRUE(ValidateWorkerId("host-1.example.org:rank_7").ok());
  EXPECT_TRUE(ValidateWorkerId(std::string(64, 'a')).ok());
  EXPECT_TRUE(ValidateWorkerId(std::string(128, 'Z')).ok());
}

TEST(PeerTextTest, OtherWorkerIdsAreInvalidArgumentWithAShortMessage) {
  for (const std::string& bad : {std::string(), std::string(129, 'a'), std::string("a/b"), std::string("a b"),
                                 std::string("caf\xc3\xa9"), std::string("nul\0x", 5), std::string(1 << 20, 'x')}) {
    absl::Status s = ValidateWorkerId(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.size();
    EXPECT_LE(s.message().size(), 200u) << s.message();
  }
  EXPECT_NE(ValidateWorkerId(std::string(129, 'a')).message().find("129 characters"), std::string::npos);
  EXPECT_NE(ValidateWorkerId("a/b").message().find("0x2f at position 1"), std::string::npos)
      << ValidateWorkerId("a/b").message();
}

TEST(PeerTextTest, TruncatedKeepsShortTextAndSaysHowMuchWasCut) {
  EXPECT_EQ(Truncated("short", 100), "short");
  EXPECT_EQ(Truncated(std::string(100, 'a'), 100), std::string(100, 'a'));
  const std::string cut = Truncated(std::string(5000, 'b'), 100);
  EXPECT_LE(cut.size(), 100u);
  EXPECT_EQ(cut.substr(0, 60), std::string(60, 'b'));
  const size_t kept = cut.find(' ');
  EXPECT_NE(cut.find("(" + std::to_string(5000 - kept) + " bytes cut)"), std::string::npos) << cut;
  EXPECT_LE(Truncated(std::string(50, 'c'), 10).size(), 10u);
}

TEST(PeerTextTest, BoundedStatusKeepsTheCode) {
  absl::Status big = absl::InvalidArgumentError(std::string(1 << 20, 'x'));
  absl::Status bounded = WithBoundedMessage(big);
  EXPECT_EQ(bounded.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LE(bounded.message().size(), kMaxRefusalBytes);
  EXPECT_EQ(WithBoundedMessage(absl::NotFoundError("x")).message(), "x");
}

}  // namespace
}  // namespace diloco
