// Backoff (worker/backoff.h) with an injected random source and sleeper: bounds, doubling to the cap, jitter,
// Reset, and the stop flag cutting a sleep short.
#include "worker/backoff.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

namespace diloco {
namespace {

struct FakeSleep {
  std::vector<double> calls;
  double total() const {
    double t = 0;
    for (double c : calls) t += c;
    return t;
  }
};

Backoff Make(double max_s, Backoff::Uniform u, FakeSleep* sleep) {
  return Backoff(max_s, std::move(u), [sleep](double s) { sleep->calls.push_back(s); });
}

TEST(BackoffTest, SleepsBetweenHalfAndFullBase) {
  const std::atomic<bool> stop{false};
  FakeSleep low, high;
  Backoff at_zero = Make(
      5.0, [] { return 0.0; }, &low);
  Backoff at_one = Make(
      5.0, [] { return 1.0; }, &high);
  EXPECT_DOUBLE_EQ(at_zero.Sleep(stop), 0.1);  // base/2 of 0.2
  EXPECT_DOUBLE_EQ(at_one.Sleep(stop), 0.2);   // base
  EXPECT_NEAR(low.total(), 0.1, 1e-12);
  EXPECT_NEAR(high.total(), 0.2, 1e-12);
  for (double c : high.calls) EXPECT_LE(c, Backoff::kTickSeconds + 1e-12);  // ticks of at most 50 ms
  EXPECT_EQ(high.calls.size(), 4u);
}

TEST(BackoffTest, DoublesUpToTheCap) {
  const std::atomic<bool> stop{false};
  FakeSleep sleep;
  Backoff b = Make(
      1.0, [] { return 1.0; }, &sleep);
  std::vector<double> slept;
  for (int i = 0; i < 6; ++i) slept.push_back(b.Sleep(stop));
  const std::vector<double> expected = {0.2, 0.4, 0.8, 1.0, 1.0, 1.0};
  ASSERT_EQ(slept.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_DOUBLE_EQ(slept[i], expected[i]) << i;
  EXPECT_NEAR(sleep.total(), 4.4, 1e-9);
}

TEST(BackoffTest, ResetReturnsToTheInitialBase) {
  const std::atomic<bool> stop{false};
  FakeSleep sleep;
  Backoff b = Make(
      5.0, [] { return 1.0; }, &sleep);
  b.Sleep(stop);
  b.Sleep(stop);
  EXPECT_DOUBLE_EQ(b.base(), 0.8);
  b.Reset();
  EXPECT_DOUBLE_EQ(b.base(), Backoff::kInitialSeconds);
  EXPECT_DOUBLE_EQ(b.Sleep(stop), 0.2);
}

TEST(BackoffTest, JitterVariesWithinBounds) {
  const std::atomic<bool> stop{false};
  FakeSleep sleep;
  auto rng = std::make_shared<std::mt19937_64>(42);
  Backoff b = Make(
      5.0, [rng] { return std::uniform_real_distribution<double>(0, 1)(*rng); }, &sleep);
  std::set<double> seen;
  for (int i = 0; i < 20; ++i) {
    b.Reset();
    const double t = b.Sleep(stop);
    EXPECT_GE(t, 0.1);
    EXPECT_LE(t, 0.2);
    seen.insert(t);
  }
  EXPECT_GT(seen.size(), 15u);  // not a constant
  // The default random source (std::random_device seeded) varies too.
  Backoff real(5.0, {}, [](double) {});
  std::set<double> defaults;
  for (int i = 0; i < 10; ++i) {
    real.Reset();
    defaults.insert(real.Sleep(stop));
  }
  EXPECT_GT(defaults.size(), 1u);
}

TEST(BackoffTest, StopFlagCutsTheSleepShort) {
  std::atomic<bool> stop{false};
  std::vector<double> calls;
  Backoff b(
      100.0, [] { return 1.0; },
      [&](double s) {
        calls.push_back(s);
        if (calls.size() == 3) stop = true;
      });
  b.Sleep(stop);  // 0.2 s = 4 ticks, stopped after 3
  EXPECT_EQ(calls.size(), 3u);
  calls.clear();
  b.Sleep(stop);  // already stopped: no tick at all
  EXPECT_TRUE(calls.empty());
}

}  // namespace
}  // namespace diloco
