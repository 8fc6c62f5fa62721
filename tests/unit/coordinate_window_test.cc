// The streamed coordinate-wise rules (coordinator/coordinate_window.h) against numpy: golden values from
// tests/golden/make_robust_golden.py (trim 0, an even count, trim lowered, one push, ties, an outlier, a fixed and a
// derived tau), fed chunk by chunk with the pushes at different speeds; and the window's bounds and refusals.
#include "coordinator/coordinate_window.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace coordinate_window_golden {
#include "tests/unit/coordinate_window_golden.inc"
}  // namespace coordinate_window_golden

namespace diloco {
namespace {

using coordinate_window_golden::StreamCase;
using coordinate_window_golden::StreamCases;

std::string Id(int i) { return "w" + std::to_string(i); }

CoordinateWindow::Options OptionsOf(const StreamCase& c, int64_t window_chunks) {
  CoordinateWindow::Options o;
  o.rule = std::string(c.rule) == "trimmed_mean" ? Aggregation::kTrimmedMean : Aggregation::kCenteredClip;
  o.trim = c.trim;
  o.iterations = c.iterations;
  o.tau = c.tau;
  o.window_chunks = window_chunks;
  return o;
}

CoordinateWindow OpenWindow(CoordinateWindow::Options o, int k) {
  CoordinateWindow w(o);
  std::vector<std::string> ids;
  for (int i = 0; i < k; ++i) {
    ids.push_back(Id(i));
    w.Declare(Id(i));
  }
  EXPECT_TRUE(w.TryOpen(ids, /*force=*/false, 1));
  return w;
}

// Feeds every push's chunks: push i hands in up to i + 1 chunks per turn while it has room (so push 0 is the
// slowest and the others run ahead to the window's edge). Returns the reduced values in order.
std::vector<double> Stream(CoordinateWindow& w, const StreamCase& c, int64_t* max_held) {
  std::vector<double> out(static_cast<size_t>(c.n), NAN);
  std::vector<int> next(static_cast<size_t>(c.k), 0);
  const int chunks = (c.n + c.chunk - 1) / c.chunk;
  bool left = true;
  while (left) {
    left = false;
    for (int i = 0; i < c.k; ++i) {
      for (int turn = 0; turn <= i && next[i] < chunks && w.HasRoom(Id(i)); ++turn) {
        const int64_t offset = int64_t{next[i]} * c.chunk;
        const int64_t count = std::min<int64_t>(c.chunk, c.n - offset);
        std::vector<float> row;
        for (int64_t j = 0; j < count; ++j) row.push_back(static_cast<float>(c.d[i * c.n + offset + j]));
        auto done = w.Put(Id(i), 0, offset, at::tensor(row, at::kFloat));
        EXPECT_TRUE(done.ok()) << done.status();
        if (done.ok() && done->has_value()) {
          const at::Tensor v = (*done)->values.to(at::kDouble).contiguous();
          for (int64_t j = 0; j < v.numel(); ++j) out[(*done)->offset + j] = v.data_ptr<double>()[j];
        }
        *max_held = std::max(*max_held, w.held_chunks());
        ++next[i];
      }
      if (next[i] < chunks) left = true;
    }
  }
  for (int i = 0; i < c.k; ++i) EXPECT_TRUE(w.Finish(Id(i)));
  return out;
}

TEST(CoordinateWindowTest, StreamedRulesMatchNumpy) {
  for (const StreamCase& c : StreamCases()) {
    for (int64_t window_chunks : {1, 2, 8}) {
      CoordinateWindow w = OpenWindow(OptionsOf(c, window_chunks), c.k);
      int64_t max_held = 0;
      const std::vector<double> got = Stream(w, c, &max_held);
      EXPECT_TRUE(w.complete()) << c.name;
      EXPECT_LE(max_held, c.k * window_chunks) << c.name;
      for (int j = 0; j < c.n; ++j) {
        EXPECT_NEAR(got[j], c.out[j], 1e-9 * std::max(1.0, std::fabs(c.out[j])))
            << c.name << " window " << window_chunks << " [" << j << "]";
      }
      // trimmed_mean: the share of its coordinates at which each push was dropped (0 under centered_clip)
      for (int i = 0; i < c.k; ++i) {
        EXPECT_DOUBLE_EQ(w.TrimmedShare(Id(i)), static_cast<double>(c.dropped[i]) / c.n) << c.name << " push " << i;
      }
    }
  }
}

TEST(CoordinateWindowTest, APushRunsAtMostWindowChunksAhead) {
  CoordinateWindow::Options o;
  o.window_chunks = 2;
  CoordinateWindow w = OpenWindow(o, 3);
  const at::Tensor chunk = at::ones({4}, at::kFloat);
  ASSERT_TRUE(w.Put("w1", 0, 0, chunk).ok());
  ASSERT_TRUE(w.Put("w1", 0, 4, chunk).ok());
  EXPECT_FALSE(w.HasRoom("w1"));  // two ahead of w0 and w2
  EXPECT_EQ(w.held_chunks(), 2);
  EXPECT_EQ(w.Laggards(), (std::vector<std::string>{"w0", "w2"}));
  ASSERT_TRUE(w.Put("w0", 0, 0, chunk).ok());
  EXPECT_FALSE(w.HasRoom("w1"));
  auto done = w.Put("w2", 0, 0, chunk);  // chunk 0 complete: reduced, and w1 has room again
  ASSERT_TRUE(done.ok());
  ASSERT_TRUE(done->has_value());
  EXPECT_EQ((*done)->offset, 0);
  EXPECT_TRUE(w.HasRoom("w1"));
  EXPECT_EQ(w.reduced(), 1);
  EXPECT_EQ(w.held_chunks(), 1);
  EXPECT_FALSE(w.HasRoom("stranger"));
}

TEST(CoordinateWindowTest, RefusesAChunkThatDoesNotLineUp) {
  CoordinateWindow w = OpenWindow(CoordinateWindow::Options(), 2);
  ASSERT_TRUE(w.Put("w0", 0, 0, at::ones({4}, at::kFloat)).ok());
  auto bad = w.Put("w1", 0, 0, at::ones({3}, at::kFloat));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("line up"), std::string::npos) << bad.status();
}

// With the coordinator's chunking as the reference (Options.chunk_elements: tensor 0 of 10 elements in chunks of 4),
// the push cut otherwise is the one refused, even when its chunk came first; the coordinator's chunks go in.
TEST(CoordinateWindowTest, RefusesAChunkNotCutAsTheCoordinatorCutsIt) {
  CoordinateWindow::Options o;
  o.chunk_elements = {4};
  o.numel = {10};
  CoordinateWindow w = OpenWindow(o, 2);
  auto first = w.Put("w0", 0, 0, at::ones({3}, at::kFloat));
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(first.status().message().find("4 elements a chunk"), std::string::npos) << first.status();
  EXPECT_TRUE(w.Put("w1", 0, 0, at::ones({4}, at::kFloat)).ok());
  EXPECT_FALSE(w.Put("w1", 0, 5, at::ones({4}, at::kFloat)).ok()) << "not at a multiple of 4";
  EXPECT_TRUE(w.Put("w0", 0, 0, at::ones({4}, at::kFloat)).ok());
  EXPECT_TRUE(w.Put("w0", 0, 4, at::ones({4}, at::kFloat)).ok());
  EXPECT_FALSE(w.Put("w0", 0, 8, at::ones({4}, at::kFloat)).ok()) << "the last chunk holds the 2 left";
  EXPECT_TRUE(w.Put("w0", 0, 8, at::ones({2}, at::kFloat)).ok());
}

TEST(CoordinateWindowTest, FinishRefusesADifferentChunkCount) {
  CoordinateWindow w = OpenWindow(CoordinateWindow::Options(), 2);
  ASSERT_TRUE(w.Put("w0", 0, 0, at::ones({4}, at::kFloat)).ok());
  ASSERT_TRUE(w.Put("w1", 0, 0, at::ones({4}, at::kFloat)).ok());
  ASSERT_TRUE(w.Put("w1", 0, 4, at::ones({4}, at::kFloat)).ok());
  EXPECT_TRUE(w.Finish("w0"));
  EXPECT_FALSE(w.Finish("w1"));
  EXPECT_FALSE(w.complete());
}

TEST(CoordinateWindowTest, TheSetIsFixedWhenEveryExpectedMemberDeclaredOrForced) {
  CoordinateWindow::Options o;
  o.max_members = 3;
  CoordinateWindow w(o);
  w.Declare("a");
  EXPECT_FALSE(w.TryOpen({"a", "b"}, /*force=*/false, 1));
  EXPECT_FALSE(w.TryOpen({"a", "b"}, /*force=*/true, 2));  // min_workers 2
  EXPECT_TRUE(w.TryOpen({"a", "b"}, /*force=*/true, 1));
  EXPECT_TRUE(w.Holds("a"));
  w.Declare("b");  // too late: the set is fixed
  EXPECT_FALSE(w.Holds("b"));
  w.Reset();
  EXPECT_FALSE(w.open());
  for (const char* id : {"a", "b", "c", "d"}) w.Declare(id);
  EXPECT_TRUE(w.TryOpen({"a", "b", "c", "d", "e"}, /*force=*/false, 1));  // max_members declared
  EXPECT_EQ(w.size(), 3u);
  // Only members still expected are in the set: "x" declared and was then lost; "b" joined again (Forget) and has
  // not declared anew.
  w.Reset();
  for (const char* id : {"a", "b", "x"}) w.Declare(id);
  w.Forget("b");
  EXPECT_FALSE(w.TryOpen({"a", "b"}, /*force=*/false, 1));
  EXPECT_FALSE(w.TryOpen({"a", "b"}, /*force=*/true, 2)) << "x does not count toward min_workers";
  EXPECT_TRUE(w.TryOpen({"a", "b"}, /*force=*/true, 1));
  EXPECT_TRUE(w.Holds("a"));
  EXPECT_FALSE(w.Holds("x"));
  EXPECT_EQ(w.Unfinished(), std::vector<std::string>{"a"});
  EXPECT_TRUE(w.Waits("a"));
}

}  // namespace
}  // namespace diloco
