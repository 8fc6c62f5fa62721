// Activation checkpointing (model.activation_checkpointing, worker/lm/checkpointed.h): for gpt, gpt2 and llama
// (grouped-query attention) the loss and every parameter's gradient equal those without it, in fp32 and under CPU
// bf16 autocast (the recompute must run under the forward's autocast state, else its gradients are fp32 ones); the
// gradients land in FlatAdamW's flat buffer in place; the autograd graph holds one node per block instead of the
// block's ops; eval mode and no-grad use no checkpointing.
#include "worker/lm/checkpointed.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tests/unit/tiny_models.h"
#include "worker/flat_adamw.h"
#include "worker/lm/language_model.h"
#include "worker/lm/torch_compat.h"

namespace diloco {
namespace {

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

ModelConfig TinyGpt() {
  ModelConfig m;
  m.vocab_size = 64;
  m.seq_len = 16;
  m.n_layer = 2;
  m.n_head = 4;
  m.d_model = 32;
  return m;
}

std::vector<ModelConfig> Archs() { return {TinyGpt(), TinyGpt2(), TinyLlama(false)}; }

// CPU bf16 autocast on for its scope (what the trainer does for workers.precision bf16), restored after.
class CpuBf16Autocast {
 public:
  explicit CpuBf16Autocast(bool on) : on_(on) {
    if (!on_) return;
    torch_compat::SetAutocast(at::kCPU, true, at::kBFloat16);
  }
  ~CpuBf16Autocast() {
    if (!on_) return;
    torch_compat::SetAutocast(at::kCPU, false, at::kBFloat16);
    at::autocast::clear_cache();
  }

 private:
  bool on_;
};

struct LossAndGrads {
  double loss = 0;
  std::vector<torch::Tensor> grads;  // parameter order
};

// One forward (under autocast when bf16) and backward (outside it, as in the trainer) on a fixed batch.
LossAndGrads ForwardBackward(ModelConfig c, bool checkpointing, bool bf16) {
  c.activation_checkpointing = checkpointing;
  auto model = MakeLanguageModel(c, 7);
  torch::manual_seed(21);
  const torch::Tensor data = torch::randint(0, c.vocab_size, {3, c.seq_len + 1}, torch::kLong);
  torch::Tensor loss;
  {
    CpuBf16Autocast autocast(bf16);
    loss = model->Loss(data.narrow(1, 0, c.seq_len), data.narrow(1, 1, c.seq_len));
  }
  loss.backward();
  LossAndGrads out{loss.item<double>(), {}};
  for (const auto& [name, p] : NamedParameters(*model)) {
    EXPECT_TRUE(p.grad().defined()) << name;
    out.grads.push_back(p.grad().clone());
  }
  return out;
}

// Tolerances: 1e-6 of each parameter's largest gradient element and 1e-6 of the loss (measured: both bitwise equal,
// fp32 and bf16, every arch: the recompute repeats the same ops on the same input). A recompute that ran without the
// forward's autocast would differ by bf16 rounding, ~2.6e-2 of it (Bf16GradientsDifferFromFp32).
TEST(CheckpointedTest, SameLossAndGradientsForEveryArch) {
  for (const ModelConfig& c : Archs()) {
    for (bool bf16 : {false, true}) {
      const LossAndGrads plain = ForwardBackward(c, false, bf16);
      const LossAndGrads recomputed = ForwardBackward(c, true, bf16);
      const std::string what = std::string(EnumName(c.arch)) + (bf16 ? " bf16" : " fp32");
      EXPECT_NEAR(recomputed.loss, plain.loss, 1e-6 * plain.loss) << what;
      ASSERT_EQ(recomputed.grads.size(), plain.grads.size());
      for (size_t i = 0; i < plain.grads.size(); ++i) {
        const double largest = plain.grads[i].abs().max().item<double>();
        EXPECT_GT(largest, 0) << what << " parameter " << i;
        EXPECT_LE(MaxAbsDiff(recomputed.grads[i], plain.grads[i]), 1e-6 * largest) << what << " parameter " << i;
      }
    }
  }
}

// The bf16 run really differs from fp32 (so the bf16 comparison above is one of bf16 gradients).
TEST(CheckpointedTest, Bf16GradientsDifferFromFp32) {
  const LossAndGrads fp32 = ForwardBackward(TinyLlama(false), true, false);
  const LossAndGrads bf16 = ForwardBackward(TinyLlama(false), true, true);
  double worst = 0;
  for (size_t i = 0; i < fp32.grads.size(); ++i) {
    worst = std::max(worst, MaxAbsDiff(bf16.grads[i], fp32.grads[i]) / fp32.grads[i].abs().max().item<double>());
  }
  EXPECT_GT(worst, 1e-4);
}

// FlatAdamW: gradients accumulate into its flat buffer in place (Step throws if one was replaced), and three steps
// give the same parameters with and without checkpointing, in fp32 and bf16. With bf16 this also checks that the
// recompute leaves no cached bf16 weights behind, which the next step's forward would use, stale, after AdamW moved
// the weights (autocast caches casts of leaf weights passed to an op directly: gpt2's Conv1D addmm; the C++ Linear
// passes weight.t(), a view, which is never cached).
TEST(CheckpointedTest, WorksWithFlatAdamW) {
  for (const ModelConfig& arch : Archs()) {
    for (bool bf16 : {false, true}) {
      std::vector<torch::Tensor> after;
      for (bool checkpointing : {false, true}) {
        ModelConfig c = arch;
        c.activation_checkpointing = checkpointing;
        auto model = MakeLanguageModel(c, 3);
        FlatAdamW opt(model->parameters(), AdamWSettings{});
        torch::manual_seed(5);
        const torch::Tensor data = torch::randint(0, 64, {2, 17}, torch::kLong);
        for (int step = 0; step < 3; ++step) {
          opt.ZeroGrad();
          torch::Tensor loss;
          {
            CpuBf16Autocast autocast(bf16);
            loss = model->Loss(data.narrow(1, 0, 16), data.narrow(1, 1, 16));
          }
          loss.backward();
          EXPECT_GT(opt.flat_gradients().abs().sum().item<double>(), 0);
          ASSERT_NO_THROW(opt.Step(1e-2));
        }
        after.push_back(opt.flat_parameters().clone());
      }
      EXPECT_LE(MaxAbsDiff(after[0], after[1]), 1e-6) << EnumName(arch.arch) << (bf16 ? " bf16" : " fp32");
    }
  }
}

// Autograd nodes reachable from t's grad_fn, and how many of them are checkpointed blocks.
std::pair<size_t, size_t> CountNodes(const torch::Tensor& t) {
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack{t.grad_fn().get()};
  size_t blocks = 0;
  while (!stack.empty()) {
    torch::autograd::Node* n = stack.back();
    stack.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    if (n->name().find("CheckpointFunction") != std::string::npos) ++blocks;
    for (const auto& edge : n->next_edges()) stack.push_back(edge.function.get());
  }
  return {seen.size(), blocks};
}

// What checkpointing keeps for backward: one node per block (holding the block's input) instead of the block's
// ops (each holding its own activations). Only while training with grad mode on.
TEST(CheckpointedTest, GraphKeepsOneNodePerBlockOnlyWhileTraining) {
  for (ModelConfig c : Archs()) {
    const torch::Tensor tokens = torch::randint(0, c.vocab_size, {2, c.seq_len}, torch::kLong);
    const auto [plain_nodes, plain_blocks] = CountNodes(MakeLanguageModel(c, 1)->forward(tokens));
    c.activation_checkpointing = true;
    auto model = MakeLanguageModel(c, 1);
    const auto [nodes, blocks] = CountNodes(model->forward(tokens));
    const std::string arch(EnumName(c.arch));
    EXPECT_EQ(plain_blocks, 0u) << arch;
    EXPECT_EQ(blocks, static_cast<size_t>(c.n_layer)) << arch;
    EXPECT_LT(nodes + 10 * static_cast<size_t>(c.n_layer), plain_nodes)
        << arch << ": " << nodes << " vs " << plain_nodes;
    model->eval();
    EXPECT_EQ(CountNodes(model->forward(tokens)).second, 0u) << arch << " eval mode";
    model->train();
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(model->forward(tokens).requires_grad()) << arch << " no grad";
  }
}

TEST(CheckpointedTest, RefusesDoubleBackwardAndMatchesThePlainBlock) {
  torch::nn::Linear block(4, 4);
  const torch::Tensor x = torch::randn({2, 4}, torch::requires_grad());
  auto impl = block.ptr();
  torch::Tensor y = CheckpointedBlock(
      *block, [impl](const torch::Tensor& in) { return torch::tanh(impl->forward(in)); }, x);
  EXPECT_ANY_THROW(torch::autograd::grad({y.sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true));
  // And first-order it matches the plain block, for the input and the parameters.
  torch::Tensor plain = torch::tanh(block->forward(x));
  const auto want = torch::autograd::grad({plain.sum()}, {x, block->weight, block->bias});
  const auto got = torch::autograd::grad({y.sum()}, {x, block->weight, block->bias});
  for (size_t i = 0; i < want.size(); ++i) EXPECT_LE(MaxAbsDiff(got[i], want[i]), 1e-7) << i;
}

}  // namespace
}  // namespace diloco
