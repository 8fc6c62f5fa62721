// The wire form of a worker cluster's commands (worker/cluster_protocol.h): the documented word layout and the
// round trip of every kind.
#include "worker/cluster_protocol.h"

#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>

namespace diloco {
namespace {

TEST(ClusterProtocolTest, WordsFollowTheDocumentedLayout) {
  EXPECT_EQ(EncodeCommand(ShardCommand{3, 8}), (CommandWords{1, 3, 8, 0}));
  EXPECT_EQ(EncodeCommand(ShardCommand{3, 8, 2}), (CommandWords{1, 3, 8, 2}));
  EXPECT_EQ(EncodeCommand(LoadCommand{}), (CommandWords{2, 0, 0, 0}));
  EXPECT_EQ(EncodeCommand(TrainCommand{1500, 50}), (CommandWords{3, 1500, 50, 0}));
  const CommandWords merge = EncodeCommand(MergeCommand{2, 0.25});
  int64_t bits = 0;
  const double alpha = 0.25;
  std::memcpy(&bits, &alpha, sizeof(bits));
  EXPECT_EQ(merge, (CommandWords{4, 2, 0, bits}));
  EXPECT_EQ(EncodeCommand(StopCommand{}), (CommandWords{5, 0, 0, 0}));
  EXPECT_EQ(EncodeCommand(StopCommand{3}), (CommandWords{5, 3, 0, 0}));
  EXPECT_EQ(EncodeCommand(SaveCommand{12}), (CommandWords{6, 12, 0, 0}));
  EXPECT_EQ(EncodeCommand(PushPartCommand{12, 4}), (CommandWords{7, 12, 4, 0}));
  EXPECT_EQ(EncodeCommand(PullPartCommand{5}), (CommandWords{8, 0, 5, 0}));
  EXPECT_EQ(EncodeCommand(GatherCommand{}), (CommandWords{9, 0, 0, 0}));
  EXPECT_EQ(EncodeCommand(ResetMomentsCommand{}), (CommandWords{10, 0, 0, 0}));
  EXPECT_EQ(EncodeCommand(SettleCommand{true}), (CommandWords{11, 1, 0, 0}));
  EXPECT_EQ(EncodeCommand(SettleCommand{false}), (CommandWords{11, 0, 0, 0}));
}

TEST(ClusterProtocolTest, EveryKindRoundTrips) {
  const auto shard = std::get<ShardCommand>(DecodeCommand(EncodeCommand(ShardCommand{5, 7, 1})));
  EXPECT_EQ(shard.shard_index, 5);
  EXPECT_EQ(shard.shard_count, 7);
  EXPECT_EQ(shard.shard_reader, 1);
  const auto train = std::get<TrainCommand>(DecodeCommand(EncodeCommand(TrainCommand{123456789012, 3})));
  EXPECT_EQ(train.first_step, 123456789012);
  EXPECT_EQ(train.steps, 3);
  const auto merge = std::get<MergeCommand>(DecodeCommand(EncodeCommand(MergeCommand{3, 0.1})));
  EXPECT_EQ(merge.fragment, 3);
  EXPECT_EQ(merge.alpha, 0.1);  // bit for bit
  EXPECT_TRUE(std::holds_alternative<LoadCommand>(DecodeCommand(EncodeCommand(LoadCommand{}))));
  EXPECT_EQ(std::get<StopCommand>(DecodeCommand(EncodeCommand(StopCommand{}))).exit_code, 0);
  EXPECT_EQ(std::get<StopCommand>(DecodeCommand(EncodeCommand(StopCommand{3}))).exit_code, 3);
  EXPECT_EQ(std::get<SaveCommand>(DecodeCommand(EncodeCommand(SaveCommand{987654321}))).round, 987654321);
  const auto push = std::get<PushPartCommand>(DecodeCommand(EncodeCommand(PushPartCommand{77, 9})));
  EXPECT_EQ(push.round, 77);
  EXPECT_EQ(push.seq, 9);
  EXPECT_EQ(std::get<PullPartCommand>(DecodeCommand(EncodeCommand(PullPartCommand{10}))).seq, 10);
  EXPECT_TRUE(std::holds_alternative<GatherCommand>(DecodeCommand(EncodeCommand(GatherCommand{}))));
  EXPECT_TRUE(std::holds_alternative<ResetMomentsCommand>(DecodeCommand(EncodeCommand(ResetMomentsCommand{}))));
  EXPECT_TRUE(std::get<SettleCommand>(DecodeCommand(EncodeCommand(SettleCommand{true}))).counted);
  EXPECT_FALSE(std::get<SettleCommand>(DecodeCommand(EncodeCommand(SettleCommand{false}))).counted);
}

TEST(ClusterProtocolTest, UnknownKindThrows) {
  EXPECT_THROW(DecodeCommand(CommandWords{12, 0, 0, 0}), std::runtime_error);
  EXPECT_THROW(DecodeCommand(CommandWords{0, 0, 0, 0}), std::runtime_error);
}

}  // namespace
}  // namespace diloco
