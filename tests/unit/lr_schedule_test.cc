// InnerLearningRate (worker/lr_schedule.h): linear warmup, then cosine decay to lr * min_lr_ratio at the last step
// that runs, total_steps - 1.
#include "worker/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace diloco {
namespace {

InnerConfig Inner(double lr, int64_t warmup, double min_ratio) {
  InnerConfig inner;
  inner.lr = lr;
  inner.warmup_steps = warmup;
  inner.min_lr_ratio = min_ratio;
  return inner;
}

constexpr double kTol = 1e-15;

TEST(LrScheduleTest, WarmupIsLinearFromOneStep) {
  const InnerConfig inner = Inner(4e-3, 10, 0.1);
  for (int64_t step = 0; step < 10; ++step) {
    EXPECT_NEAR(InnerLearningRate(inner, step, 110), 4e-3 * (step + 1) / 10.0, kTol) << "step " << step;
  }
  EXPECT_NEAR(InnerLearningRate(inner, 0, 110), 4e-4, kTol) << "step 0 already trains (lr > 0)";
}

TEST(LrScheduleTest, PeakAtEndOfWarmup) {
  const InnerConfig inner = Inner(4e-3, 10, 0.1);
  EXPECT_NEAR(InnerLearningRate(inner, 9, 110), 4e-3, kTol) << "last warmup step";
  EXPECT_NEAR(InnerLearningRate(inner, 10, 110), 4e-3, kTol) << "first cosine step";
  EXPECT_LT(InnerLearningRate(inner, 11, 110), 4e-3);
}

TEST(LrScheduleTest, CosineMidpointAndQuarter) {
  const InnerConfig inner = Inner(4e-3, 10, 0.1);
  // total 111: cosine from step 10 to the last step 110, span 100: midpoint at step 60 -> lr * (0.1 + 0.9 * 0.5).
  EXPECT_NEAR(InnerLearningRate(inner, 60, 111), 4e-3 * 0.55, kTol);
  // A quarter in: 0.5 * (1 + cos(pi/4)).
  const double quarter = 0.5 * (1.0 + std::cos(M_PI / 4));
  EXPECT_NEAR(InnerLearningRate(inner, 35, 111), 4e-3 * (0.1 + 0.9 * quarter), kTol);
}

TEST(LrScheduleTest, FinalValueIsMinRatio) {
  const InnerConfig inner = Inner(4e-3, 10, 0.1);
  EXPECT_NEAR(InnerLearningRate(inner, 109, 110), 4e-4, kTol) << "the last step that runs is at the floor";
  EXPECT_GT(InnerLearningRate(inner, 108, 110), 4e-4 + 1e-9);
  EXPECT_NEAR(InnerLearningRate(inner, 500, 110), 4e-4, kTol) << "past the end it stays at the floor";
}

TEST(LrScheduleTest, MonotoneDecayAfterWarmup) {
  const InnerConfig inner = Inner(1.0, 5, 0.0);
  double previous = InnerLearningRate(inner, 5, 50);
  for (int64_t step = 6; step <= 49; ++step) {
    const double lr = InnerLearningRate(inner, step, 50);
    EXPECT_LT(lr, previous) << "step " << step;
    previous = lr;
  }
  EXPECT_NEAR(previous, 0.0, kTol);
}

TEST(LrScheduleTest, NoWarmupStartsAtPeak) {
  const InnerConfig inner = Inner(2e-3, 0, 0.5);
  EXPECT_NEAR(InnerLearningRate(inner, 0, 100), 2e-3, kTol);
  EXPECT_NEAR(InnerLearningRate(inner, 50, 101), 2e-3 * 0.75, kTol);
  EXPECT_NEAR(InnerLearningRate(inner, 100, 101), 1e-3, kTol);
}

// The schedule follows the global progress: sync rounds at round x H (+ steps carried over), async versions at their
// share of the outer.rounds x workers.count pushes, so a fast and a slow worker pulling the same version get the same
// lr.
TEST(LrScheduleTest, ScheduleStartFollowsGlobalProgress) {
  Config config;
  config.inner.steps = 50;
  config.workers.count = 2;
  config.outer.rounds = 10;
  EXPECT_EQ(ScheduleStart(config, 3, 0), 150);
  EXPECT_EQ(ScheduleStart(config, 3, 2), 152);
  config.comm.fragments = 2;  // Streaming DiLoCo: a round is one fragment's sync, every H / 2 steps
  EXPECT_EQ(ScheduleStart(config, 3, 0), 75);
  config.comm.fragments = 1;
  config.outer.mode = OuterMode::kAsync;
  EXPECT_EQ(ScheduleStart(config, 0, 0), 0);
  EXPECT_EQ(ScheduleStart(config, 6, 0), 150) << "version 6 of 20 pushes = 3 sync rounds of 50 steps";
  EXPECT_EQ(ScheduleStart(config, 19, 0), 475) << "the last push of the run starts near the end of the cosine";
}

}  // namespace
}  // namespace diloco
