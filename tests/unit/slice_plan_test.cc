// The slices of a sharded cluster (proto/slice_plan.h): equal, chunk-aligned, covering the buffer exactly once.
#include "proto/slice_plan.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace diloco {
namespace {

TEST(SlicePlanTest, SlicesAreChunkAlignedAndTileTheBufferOnce) {
  // 10 elements, 3 ranks, chunks of 2: S = ceil(10 / 6) * 2 = 4 -> [0,4) [4,8) [8,10), padded to 12.
  const SlicePlan plan(10, 3, 2);
  EXPECT_EQ(plan.slice_length(), 4);
  EXPECT_EQ(plan.padded_numel(), 12);
  EXPECT_EQ(plan.slice(0), (FlatRange{0, 4}));
  EXPECT_EQ(plan.slice(1), (FlatRange{4, 8}));
  EXPECT_EQ(plan.slice(2), (FlatRange{8, 10}));
  EXPECT_EQ(plan.slice(2).size(), 2);
}

TEST(SlicePlanTest, TrailingSlicesMayBeEmptyWhenChunksAreLarge) {
  // 5 elements, 4 ranks, chunks of 4: S = 4 -> [0,4) [4,5) [5,5) [5,5).
  const SlicePlan plan(5, 4, 4);
  EXPECT_EQ(plan.slice_length(), 4);
  EXPECT_EQ(plan.slice(1), (FlatRange{4, 5}));
  EXPECT_EQ(plan.slice(2).size(), 0);
  EXPECT_EQ(plan.slice(3), (FlatRange{5, 5}));
}

TEST(SlicePlanTest, OneRankOwnsEverything) {
  const SlicePlan plan(7, 1, 3);
  EXPECT_EQ(plan.slice(0), (FlatRange{0, 7}));
  EXPECT_EQ(plan.padded_numel(), 9);
}

TEST(SlicePlanTest, BadArgumentsAreRefused) {
  EXPECT_THROW(SlicePlan(10, 0, 2), std::invalid_argument);
  EXPECT_THROW(SlicePlan(10, 2, 0), std::invalid_argument);
  EXPECT_THROW(SlicePlan(10, 2, 2).slice(2), std::out_of_range);
}

}  // namespace
}  // namespace diloco
