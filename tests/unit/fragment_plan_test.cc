// Streaming DiLoCo's fragments (proto/fragment_plan.h) on the real model's parameter names.
#include "proto/fragment_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.h"
#include "worker/lm/language_model.h"

namespace diloco {
namespace {

std::vector<std::string> ModelNames(int64_t n_layer) {
  ModelConfig m;
  m.vocab_size = 32;
  m.seq_len = 8;
  m.n_layer = n_layer;
  m.n_head = 2;
  m.d_model = 8;
  std::vector<std::string> names;
  for (const auto& [name, p] : NamedParameters(*MakeLanguageModel(m, 1))) names.push_back(name);
  return names;
}

TEST(FragmentsTest, BlocksAreStridedEmbeddingsGoFirstAndTheFinalNormLast) {
  const std::vector<std::string> names = ModelNames(3);
  const std::vector<int> f = AssignFragments(names, 2);
  ASSERT_EQ(f.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    int want = -1;
    if (n.rfind("tok_emb", 0) == 0 || n.rfind("pos_emb", 0) == 0) want = 0;
    if (n.rfind("blocks.0.", 0) == 0 || n.rfind("blocks.2.", 0) == 0) want = 0;
    if (n.rfind("blocks.1.", 0) == 0 || n.rfind("ln_f", 0) == 0) want = 1;
    ASSERT_NE(want, -1) << "unexpected parameter " << n;
    EXPECT_EQ(f[i], want) << n;
  }
}

TEST(FragmentsTest, OneFragmentHoldsEverythingAndMembersKeepParameterOrder) {
  const std::vector<std::string> names = ModelNames(2);
  const auto one = FragmentMembers(AssignFragments(names, 1), 1);
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(one[0].size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(one[0][i], i);

  const auto three = FragmentMembers(AssignFragments(names, 3), 3);  // blocks 0, 1 and ln_f in fragment 2
  ASSERT_EQ(three.size(), 3u);
  size_t total = 0;
  for (const auto& members : three) {
    EXPECT_FALSE(members.empty());
    for (size_t j = 1; j < members.size(); ++j) EXPECT_LT(members[j - 1], members[j]);
    total += members.size();
  }
  EXPECT_EQ(total, names.size());
  EXPECT_EQ(names[three[2].back()], "ln_f.bias");
}

TEST(FragmentsTest, MultiDigitBlockIndicesParse) {
  const std::vector<int> f =
      AssignFragments({"tok_emb.weight", "blocks.10.fc.weight", "blocks.11.fc.weight", "ln_f.weight"}, 4);
  EXPECT_EQ(f, (std::vector<int>{0, 2, 3, 3}));
}

// Llama's names (untied head): the layer index is "model.layers.<i>."; the embedding goes first, the final norm and
// lm_head (after it) last.
TEST(FragmentsTest, LlamaLayersAreStridedAndTheUntiedHeadGoesLast) {
  ModelConfig m;
  m.arch = ModelArch::kLlama;
  m.vocab_size = 32;
  m.seq_len = 8;
  m.n_layer = 3;
  m.n_head = 2;
  m.d_model = 8;
  m.tie_embeddings = false;
  std::vector<std::string> names;
  for (const auto& [name, p] : NamedParameters(*MakeLanguageModel(m, 1))) names.push_back(name);
  const std::vector<int> f = AssignFragments(names, 2);
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    int want = -1;
    if (n == "model.embed_tokens.weight" || n.rfind("model.layers.0.", 0) == 0 || n.rfind("model.layers.2.", 0) == 0) {
      want = 0;
    }
    if (n.rfind("model.layers.1.", 0) == 0 || n == "model.norm.weight" || n == "lm_head.weight") want = 1;
    ASSERT_NE(want, -1) << "unexpected parameter " << n;
    EXPECT_EQ(f[i], want) << n;
  }
  EXPECT_EQ(names.back(), "lm_head.weight");
}

TEST(FragmentsTest, Gpt2NamesUseTheirFirstIntegerComponent) {
  const std::vector<int> f =
      AssignFragments({"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
                       "transformer.h.1.attn.c_attn.bias", "transformer.h.2.mlp.c_fc.weight",
                       "transformer.h.3.attn.c_attn.bias", "transformer.ln_f.weight", "transformer.ln_f.bias"},
                      3);
  EXPECT_EQ(f, (std::vector<int>{0, 0, 0, 1, 2, 0, 2, 2}));
  // Only a whole component counts: "h2o" or "v1" are names, not layer indices.
  EXPECT_EQ(AssignFragments({"emb.v1", "layers.1.w", "h2o.weight"}, 2), (std::vector<int>{0, 1, 1}));
}

}  // namespace
}  // namespace diloco
