// The test-only worker attacks (worker/attack.h): parsing, and what each one makes of an honest push, in particular
// copy:PATH reading what another worker's --dump-delta wrote.
#include "worker/attack.h"

#include <gtest/gtest.h>

#include <thread>

#include "tests/unit/scratch_dir_test.h"

namespace diloco {
namespace {

RoundResult Honest(float value, int64_t tokens = 1000) {
  RoundResult r;
  r.pseudo_gradient.emplace_back("w", at::full({2, 3}, value));
  r.pseudo_gradient.emplace_back("b", at::full({3}, -value));
  r.report.tokens = tokens;
  return r;
}

TEST(AttackParseTest, KindsAndRefusals) {
  EXPECT_EQ(ParseAttack("")->kind, AttackSpec::Kind::kNone);
  EXPECT_EQ(ParseAttack("scale:-1000")->factor, -1000);
  EXPECT_EQ(ParseAttack("stale")->kind, AttackSpec::Kind::kStale);
  auto copy = ParseAttack("copy:/tmp/a:b.bin");
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ(copy->kind, AttackSpec::Kind::kCopy);
  EXPECT_EQ(copy->copy_path, "/tmp/a:b.bin");  // only the first ':' separates
  EXPECT_NE(ParseAttack("copy").status().message().find("copy needs :PATH"), std::string::npos);
  EXPECT_NE(ParseAttack("copy:").status().message().find("copy needs :PATH"), std::string::npos);
  EXPECT_NE(ParseAttack("flip:2").status().message().find("copy, nan-step or throw-step"), std::string::npos);
  EXPECT_EQ(ParseAttack("nan-step:12")->fault_step, 12);
  EXPECT_EQ(ParseAttack("throw-step:3")->kind, AttackSpec::Kind::kThrowStep);
  EXPECT_EQ(ParseAttack("throw-step:3")->fault_step, 3);
  EXPECT_EQ(ParseAttack("throw-step").status().message(),
            "--attack 'throw-step': throw-step needs :N, an inner step >= 0");
  EXPECT_FALSE(ParseAttack("nan-step").ok());
  EXPECT_FALSE(ParseAttack("nan-step:-1").ok());
  EXPECT_FALSE(ParseAttack("nan-step:1.5").ok());
  EXPECT_FALSE(ParseAttack("scale").ok());
  EXPECT_FALSE(ParseAttack("random:inf").ok());
}

TEST(AttackTest, ScaleStaleAndTokens) {
  Attacker scale(*ParseAttack("scale:-1000"));
  RoundResult r = Honest(0.5f);
  scale.Apply(r, 0);
  EXPECT_FLOAT_EQ(r.pseudo_gradient[0].second[1][2].item<float>(), -500.0f);
  EXPECT_FLOAT_EQ(r.pseudo_gradient[1].second[0].item<float>(), 500.0f);

  Attacker stale(*ParseAttack("stale"));
  RoundResult first = Honest(1.0f);
  stale.Apply(first, 0);  // the first round has no previous delta: its own
  EXPECT_FLOAT_EQ(first.pseudo_gradient[0].second[0][0].item<float>(), 1.0f);
  RoundResult second = Honest(2.0f);
  stale.Apply(second, 1);
  EXPECT_FLOAT_EQ(second.pseudo_gradient[0].second[0][0].item<float>(), 1.0f);
  RoundResult third = Honest(3.0f);
  stale.Apply(third, 2);
  EXPECT_FLOAT_EQ(third.pseudo_gradient[0].second[0][0].item<float>(), 2.0f);

  Attacker tokens(*ParseAttack("tokens:100"));
  RoundResult t = Honest(1.0f, 640);
  tokens.Apply(t, 0);
  EXPECT_EQ(t.report.tokens, 64000);
  EXPECT_FLOAT_EQ(t.pseudo_gradient[0].second[0][0].item<float>(), 1.0f);
}

class AttackCopyTest : public ScratchDirTest {
 protected:
  Attacker Copier(int64_t wait_ms) {
    AttackSpec spec = *ParseAttack("copy:" + Path("delta.bin"));
    spec.copy_wait_ms = wait_ms;
    return Attacker(spec);
  }
};

TEST_F(AttackCopyTest, PushesTheDumpedDeltaOfItsRoundWithItsOwnTokens) {
  const RoundResult other = Honest(0.25f, 999);
  ASSERT_TRUE(DumpDelta(Path("delta.bin"), 4, other.pseudo_gradient).ok());
  Attacker copier = Copier(600000);
  RoundResult mine = Honest(7.0f, 123);
  copier.Apply(mine, 4);
  ASSERT_EQ(mine.pseudo_gradient.size(), 2u);
  EXPECT_TRUE(mine.pseudo_gradient[0].second.equal(other.pseudo_gradient[0].second));
  EXPECT_TRUE(mine.pseudo_gradient[1].second.equal(other.pseudo_gradient[1].second));
  EXPECT_EQ(mine.pseudo_gradient[1].first, "b");
  EXPECT_EQ(mine.report.tokens, 123);
}

TEST_F(AttackCopyTest, WaitsForTheFileToReachItsRound) {
  ASSERT_TRUE(DumpDelta(Path("delta.bin"), 2, Honest(2.0f).pseudo_gradient).ok());
  std::thread dumper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_TRUE(DumpDelta(Path("delta.bin"), 3, Honest(3.0f).pseudo_gradient).ok());
  });
  Attacker copier = Copier(600000);
  RoundResult mine = Honest(9.0f);
  copier.Apply(mine, 3);
  dumper.join();
  EXPECT_FLOAT_EQ(mine.pseudo_gradient[0].second[0][0].item<float>(), 3.0f);
}

TEST_F(AttackCopyTest, AnOlderRoundIsCopiedWhenTheWaitEnds) {
  ASSERT_TRUE(DumpDelta(Path("delta.bin"), 2, Honest(2.0f).pseudo_gradient).ok());
  Attacker copier = Copier(10);
  RoundResult mine = Honest(9.0f);
  copier.Apply(mine, 5);
  EXPECT_FLOAT_EQ(mine.pseudo_gradient[0].second[0][0].item<float>(), 2.0f);
}

TEST_F(AttackCopyTest, NoFileOrAnotherLayoutKeepsTheHonestDelta) {
  Attacker copier = Copier(10);
  RoundResult mine = Honest(9.0f);
  copier.Apply(mine, 0);  // no file at all
  EXPECT_FLOAT_EQ(mine.pseudo_gradient[0].second[0][0].item<float>(), 9.0f);

  NamedTensors other_shape = {{"w", at::ones({3, 2})}, {"b", at::ones({3})}};
  ASSERT_TRUE(DumpDelta(Path("delta.bin"), 0, other_shape).ok());
  copier.Apply(mine, 0);
  EXPECT_FLOAT_EQ(mine.pseudo_gradient[0].second[0][0].item<float>(), 9.0f);

  NamedTensors other_names = {{"v", at::ones({2, 3})}, {"b", at::ones({3})}};
  ASSERT_TRUE(DumpDelta(Path("delta.bin"), 0, other_names).ok());
  copier.Apply(mine, 0);
  EXPECT_FLOAT_EQ(mine.pseudo_gradient[0].second[0][0].item<float>(), 9.0f);
}

}  // namespace
}  // namespace diloco
