// The two averages of sparse pushes (comm.topk_average, issue 30 item 2) in RoundAccumulator against
// tests/golden/sparse_average_reference.py (numpy, float32, from the SparseLoCo paper's rule): "all", ours (the
// token-weighted mean over every push, an unsent coordinate counting as 0) and "senders", SparseLoCo's (each
// coordinate over the pushes that sent it). Three pushes of different weights, overlapping positions.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "coordinator/round_accumulator.h"

namespace diloco {
namespace {

struct Push {
  double weight = 0;
  at::Tensor positions;  // int64
  at::Tensor values;     // float32
};

struct Golden {
  int64_t n = 0;
  std::vector<Push> pushes;
  std::vector<float> all, senders;
};

Golden Load() {
  std::ifstream in(std::string(DILOCO_TOPK_GOLDEN_DIR) + "/sparse_average.txt");
  Golden g;
  int64_t count = 0;
  in >> g.n >> count;
  for (int64_t i = 0; i < count; ++i) {
    Push p;
    int64_t k = 0;
    in >> p.weight >> k;
    p.positions = at::empty({k}, at::kLong);
    p.values = at::empty({k}, at::kFloat);
    for (int64_t j = 0; j < k; ++j) in >> p.positions.data_ptr<int64_t>()[j];
    for (int64_t j = 0; j < k; ++j) in >> p.values.data_ptr<float>()[j];
    g.pushes.push_back(p);
  }
  g.all.resize(g.n);
  g.senders.resize(g.n);
  for (float& x : g.all) in >> x;
  for (float& x : g.senders) in >> x;
  EXPECT_TRUE(in.good() || in.eof());
  return g;
}

void ExpectRule(bool per_coordinate, const std::vector<float>& want) {
  const Golden g = Load();
  ASSERT_GT(g.n, 0) << "no golden file: run tests/golden/sparse_average_reference.py";
  RoundAccumulator acc({TensorSpec{"x", {g.n}}}, per_coordinate);
  for (const Push& p : g.pushes) {
    acc.FoldSparse(0, 0, p.positions, p.values, p.weight);
    acc.AddContribution(p.weight);
  }
  const std::vector<at::Tensor> average = acc.TakeAverage();
  const float* got = average[0].data_ptr<float>();
  int64_t differ = 0;
  for (int64_t j = 0; j < g.n; ++j) {
    if (std::abs(got[j] - want[j]) > 1e-6f * std::abs(want[j])) ++differ;
  }
  EXPECT_EQ(differ, 0);
}

TEST(SparseAverageGolden, OursIsTheTokenWeightedMeanOverEveryPush) { ExpectRule(false, Load().all); }
TEST(SparseAverageGolden, SparseLoCosAveragesEachCoordinateOverItsSenders) { ExpectRule(true, Load().senders); }

TEST(SparseAverageGolden, TheTwoRulesDifferWhereFewerThanAllSent) {
  const Golden g = Load();
  int64_t differ = 0;
  for (int64_t j = 0; j < g.n; ++j) differ += g.all[j] != g.senders[j];
  EXPECT_GT(differ, 500);  // the golden case can tell the rules apart
}

}  // namespace
}  // namespace diloco
