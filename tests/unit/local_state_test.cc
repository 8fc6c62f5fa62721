// A worker's local state (worker/local_state.h) through its own API: what Save wrote after a push is resumed into a
// new trainer of the same identity (AdamW moments and step count; the data position of the per-step journal, newer
// than the state when the kill came mid-round), a state of another identity is ignored (a cold start), and a worker
// cluster (no state on disk) writes no file.
#include "worker/local_state.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/unit/scratch_dir_test.h"
#include "tests/unit/tiny_coordinator_config.h"
#include "tests/unit/token_files.h"
#include "worker/trainer.h"

namespace diloco {
namespace {

class LocalStateTest : public ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    config_ = TinyCoordinatorConfig(dir_);
    config_.workers.resume = true;
    config_.data.sampling = DataSampling::kSequential;
    std::vector<uint32_t> ids(20000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>((i * 7 + i / 5) % 64);
    std::string error;
    ASSERT_TRUE(WriteTokenShard(Path("t.tok"), ids, 64, &error)) << error;
    manifest_ = WriteManifest(Path("m.json"), {{Path("t.tok"), 24, 2, ids.size()}});
  }
  std::unique_ptr<InnerTrainer> Trainer() {
    auto t = InnerTrainer::ForShard(config_, manifest_, 0, 1, 0, 1);
    EXPECT_TRUE(t.ok()) << t.status();
    return std::move(*t);
  }
  StateIdentity Identity(int64_t seed = 3) const { return {"w0", "fp", seed, "data", 0, 1, "sequential"}; }

  Config config_;
  std::string manifest_;
};

TEST_F(LocalStateTest, ResumesMomentsAndTheJournalsDataPosition) {
  auto before = Trainer();
  SamplerState at_kill;
  torch::Tensor saved_moments;
  {
    LocalState state(config_, *before, Identity(), /*on_disk=*/true, 1);
    before->TrainSteps(0, 3);
    state.Save(1);
    saved_moments = before->optimizer().exp_avg().clone();
    before->TrainSteps(3, 2);  // the round a kill cuts short: only the journal has these windows
    at_kill = before->sampler_state();
  }
  ASSERT_GT(at_kill.position, 0);
  auto after = Trainer();
  LocalState resumed(config_, *after, Identity(), /*on_disk=*/true, 1);
  EXPECT_EQ(after->optimizer().steps(), 3);
  EXPECT_TRUE(torch::equal(after->optimizer().exp_avg(), saved_moments));
  EXPECT_EQ(after->sampler_state().epoch, at_kill.epoch);
  EXPECT_EQ(after->sampler_state().position, at_kill.position);

  auto other = Trainer();
  LocalState cold(config_, *other, Identity(/*seed=*/4), /*on_disk=*/true, 1);
  EXPECT_EQ(other->optimizer().steps(), 0);
  EXPECT_EQ(other->sampler_state().position, 0);
}

TEST_F(LocalStateTest, AClusterKeepsNoFiles) {
  auto trainer = Trainer();
  LocalState state(config_, *trainer, Identity(), /*on_disk=*/false, 1);
  trainer->TrainSteps(0, 2);
  state.Save(1);
  const std::string dir = config_.WorkerStateDir();
  EXPECT_FALSE(std::filesystem::exists(StatePath(dir, "w0")));
  EXPECT_FALSE(std::filesystem::exists(PositionPath(dir, "w0")));
}

}  // namespace
}  // namespace diloco
