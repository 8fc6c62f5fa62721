// Pushes in parts: the coordinator's assembly of a member's parts (coordinator/push_parts.h), and the ranged chunk
// streams they travel in (proto/tensor_chunks.h with a FlatRange).
#include "coordinator/push_parts.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "proto/tensor_chunks.h"

namespace diloco {
namespace {

using ::testing::HasSubstr;

PartHeader Part(int part, FlatRange range, int parts = 2, int64_t round = 5, int64_t tokens = 100,
                uint64_t attempt = 0) {
  return PartHeader{"m", part, parts, /*declared=*/2, range, round, tokens, /*numel=*/100, attempt};
}

PushTicket Ticket(int64_t bytes) {
  PushTicket t;
  t.worker_id = "m";
  t.bytes = bytes;
  t.tokens = 100;
  return t;
}

TEST(PushParts, CountsTheMemberOnceWhenEveryPartIsInWithBytesSummed) {
  PushParts parts;
  auto g1 = parts.Begin(Part(1, {50, 100}), 0);
  ASSERT_TRUE(g1.ok()) << g1.status();
  auto g0 = parts.Begin(Part(0, {0, 50}), 0);
  ASSERT_TRUE(g0.ok()) << g0.status();
  EXPECT_EQ(*g0, *g1);
  EXPECT_TRUE(parts.IsCurrent("m", *g0));
  EXPECT_EQ(parts.Progress("m"), std::make_pair(0, 2));
  EXPECT_EQ(parts.partial_count(), 0u);  // nothing in the sums yet
  auto first = parts.Commit(Ticket(200), 1, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->has_value());
  EXPECT_EQ(parts.Progress("m"), std::make_pair(1, 2));
  EXPECT_EQ(parts.partial_count(), 1u);  // a committed part holds the round's close
  auto whole = parts.Commit(Ticket(300), 0, 2);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE(whole->has_value());
  EXPECT_EQ((*whole)->bytes, 500);
  EXPECT_EQ((*whole)->worker_id, "m");
  EXPECT_EQ(parts.Progress("m"), std::make_pair(0, 0));  // done: no assembly left
}

TEST(PushParts, RefusesHostileParts) {
  struct Case {
    std::string what;
    PartHeader second;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"overlap", Part(1, {40, 100}), absl::StatusCode::kInvalidArgument, "overlaps part 0's [0, 50)"},
      {"part index", Part(2, {50, 100}), absl::StatusCode::kInvalidArgument, "pushes 2 parts"},
      {"not declared", Part(1, {50, 100}, /*parts=*/3), absl::StatusCode::kInvalidArgument, "cluster_size 2"},
      {"two rounds", Part(1, {50, 100}, 2, /*round=*/4), absl::StatusCode::kFailedPrecondition, "for round 5"},
      {"twice", Part(0, {0, 50}), absl::StatusCode::kFailedPrecondition, "already pushed"},
      {"two attempts", Part(1, {50, 100}, 2, 5, 100, /*attempt=*/3), absl::StatusCode::kFailedPrecondition,
       "has attempt 0 under way"},
      {"tokens", Part(1, {50, 100}, 2, 5, /*tokens=*/7), absl::StatusCode::kInvalidArgument, "tokens 7"},
      {"outside", Part(1, {50, 101}), absl::StatusCode::kInvalidArgument, "not within the round's 100 elements"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    PushParts parts;
    ASSERT_TRUE(parts.Begin(Part(0, {0, 50}), 0).ok());
    auto refused = parts.Begin(c.second, 0);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), c.code);
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr(c.message));
  }
}

TEST(PushParts, RangesThatLeaveElementsOutAreRefusedAtTheLastPart) {
  PushParts parts;
  ASSERT_TRUE(parts.Begin(Part(0, {0, 40}), 0).ok());
  ASSERT_TRUE(parts.Begin(Part(1, {50, 100}), 0).ok());
  ASSERT_TRUE(parts.Commit(Ticket(1), 0, 0).ok());
  auto last = parts.Commit(Ticket(1), 1, 0);
  ASSERT_FALSE(last.ok());
  EXPECT_EQ(last.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(last.status().message()), HasSubstr("cover 90 of the round's 100 elements"));
  EXPECT_EQ(parts.Progress("m"), std::make_pair(0, 0));
}

TEST(PushParts, DiscardSaysWhetherPartsWereInTheSumsAndMakesTheirTicketsStale) {
  PushParts parts;
  auto g = parts.Begin(Part(0, {0, 50}), 0);
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(parts.Discard("m"));  // begun, nothing folded
  EXPECT_FALSE(parts.IsCurrent("m", *g));
  auto g2 = parts.Begin(Part(0, {0, 50}), 0);  // a retry starts a new assembly
  ASSERT_TRUE(g2.ok());
  EXPECT_NE(*g2, *g);
  parts.MarkFolded("m", 1);
  EXPECT_TRUE(parts.HasFolded("m"));
  EXPECT_TRUE(parts.Discard("m"));
  EXPECT_FALSE(parts.IsCurrent("m", *g2));
}

TEST(PushParts, StalledAssembliesAreThoseWithoutProgressForStallSeconds) {
  PushParts parts;
  ASSERT_TRUE(parts.Begin(Part(0, {0, 50}), 10).ok());
  EXPECT_TRUE(parts.Stalled(12, 5, 100).empty());
  parts.MarkFolded("m", 14);
  EXPECT_TRUE(parts.Stalled(18, 5, 100).empty());
  EXPECT_EQ(parts.Stalled(20, 5, 100), std::vector<std::string>{"m"});
  EXPECT_EQ(parts.Stalled(16, 5, 5), std::vector<std::string>{"m"});  // older than max_age_s
}

// Three tensors (12, 0 and 5 elements) flattened end to end: 17 elements; the range [10, 15) starts mid-tensor and
// ends mid-tensor.
TEST(RangedChunks, AChunkerAndAReaderOfARangeAgreeAndRefuseChunksPastIt) {
  NamedTensors tensors = {{"a", at::arange(12, at::kFloat).view({3, 4})},
                          {"empty", at::zeros({0}, at::kFloat)},
                          {"b", at::arange(100, 105, at::kFloat)}};
  TensorChunker chunker(tensors, /*chunk_bytes=*/64, CODEC_RAW, FlatRange{10, 15});
  ChunkStreamReader reader(SpecsOf(tensors), FlatRange{10, 15});
  std::vector<float> got;
  std::vector<std::pair<std::string, int64_t>> starts;
  TensorChunk chunk;
  while (chunker.Next(&chunk)) {
    starts.emplace_back(chunk.name(), chunk.offset());
    auto values = reader.Next(chunk);
    ASSERT_TRUE(values.ok()) << values.status();
    for (int64_t i = 0; i < values->numel(); ++i) got.push_back(values->data_ptr<float>()[i]);
  }
  EXPECT_TRUE(reader.Done());
  EXPECT_EQ(got, (std::vector<float>{10, 11, 100, 101, 102}));
  EXPECT_EQ(starts, (std::vector<std::pair<std::string, int64_t>>{{"a", 10}, {"b", 0}}));

  ChunkStreamReader strict(SpecsOf(tensors), FlatRange{10, 13});
  TensorChunker whole_b(tensors, 64, CODEC_RAW, FlatRange{12, 17});
  TensorChunker head(tensors, 64, CODEC_RAW, FlatRange{10, 12});
  ASSERT_TRUE(head.Next(&chunk));
  ASSERT_TRUE(strict.Next(chunk).ok());
  ASSERT_TRUE(whole_b.Next(&chunk));  // b's 5 elements: 4 more than the range has left
  auto past = strict.Next(chunk);
  ASSERT_FALSE(past.ok());
  EXPECT_THAT(std::string(past.status().message()), HasSubstr("of the stream's range"));
  EXPECT_THROW(ChunkStreamReader(SpecsOf(tensors), FlatRange{0, 18}), std::out_of_range);
}

}  // namespace
}  // namespace diloco
