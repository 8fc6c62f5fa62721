// DyLU's assignment of inner steps from measured speeds (coordinator/inner_steps.h).
#include "coordinator/inner_steps.h"

#include <gtest/gtest.h>

#include <limits>

namespace diloco {
namespace {

TEST(InnerStepsTest, EachWorkerGetsItsShareOfTheFastestSpeed) {
  const auto h = AssignInnerSteps({{"fast", 20.0}, {"half", 10.0}, {"third", 20.0 / 3}, {"slowest", 0.1}}, 50);
  EXPECT_EQ(h.at("fast"), 50);
  EXPECT_EQ(h.at("half"), 25);
  EXPECT_EQ(h.at("third"), 16);   // floor(50 / 3)
  EXPECT_EQ(h.at("slowest"), 1);  // floor(0.25) = 0, but every worker trains at least one step
}

TEST(InnerStepsTest, UnmeasuredOrBrokenSpeedsGetH) {
  const auto h = AssignInnerSteps({{"new", 0.0}, {"nan", std::numeric_limits<double>::quiet_NaN()}, {"a", 4.0}}, 30);
  EXPECT_EQ(h.at("new"), 30);
  EXPECT_EQ(h.at("nan"), 30);
  EXPECT_EQ(h.at("a"), 30);
  EXPECT_TRUE(AssignInnerSteps({}, 30).empty());
}

}  // namespace
}  // namespace diloco
