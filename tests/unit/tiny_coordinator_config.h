// TinyCoordinatorConfig: the config the CoordinatorCore unit tests share: a 1-layer, d_model 16 model over a
// 64-token vocabulary, no evaluation or periodic checkpoints, rounds that close only when both of 2 workers pushed (no
// timeout). Tests change fields as they need. TinyTheta0: a theta_0 for it as plain tensors (the model's names and
// shapes, seeded values), and SumOfSquaresEvaluator a fake Evaluator, so the core is built with no files and no model.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "coordinator/evaluator.h"

namespace diloco {

inline Config TinyCoordinatorConfig(const std::filesystem::path& dir) {
  Config config;
  config.model.vocab_size = 64;
  config.model.seq_len = 16;
  config.model.n_layer = 1;
  config.model.n_head = 2;
  config.model.d_model = 16;
  config.inner.batch_size = 4;
  config.outer.rounds = 10;
  config.coordinator.eval_batches = 2;
  config.coordinator.eval_every = 0;
  config.coordinator.checkpoint_every = 0;
  config.coordinator.min_workers = 2;
  config.coordinator.round_timeout_s = 1e6;
  config.run.output_dir = (dir / "run").string();
  config.coordinator.checkpoint_dir = (dir / "ckpt").string();
  return config;
}

// theta_0 with the names and shapes of TinyCoordinatorConfig's transformer (worker/lm/language_model.h), values
// N(0, 0.02^2) from `seed`.
inline NamedTensors TinyTheta0(const ModelConfig& m, uint64_t seed = 1) {
  const int64_t d = m.d_model;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"tok_emb.weight", {m.vocab_size, d}},
                                                                      {"pos_emb.weight", {m.seq_len, d}}};
  for (int64_t b = 0; b < m.n_layer; ++b) {
    const std::string p = "blocks." + std::to_string(b) + ".";
    for (const auto& [name, shape] :
         std::vector<std::pair<std::string, std::vector<int64_t>>>{{"ln1.weight", {d}},
                                                                   {"ln1.bias", {d}},
                                                                   {"qkv.weight", {3 * d, d}},
                                                                   {"qkv.bias", {3 * d}},
                                                                   {"attn_out.weight", {d, d}},
                                                                   {"attn_out.bias", {d}},
                                                                   {"ln2.weight", {d}},
                                                                   {"ln2.bias", {d}},
                                                                   {"fc.weight", {4 * d, d}},
                                                                   {"fc.bias", {4 * d}},
                                                                   {"mlp_out.weight", {d, 4 * d}},
                                                                   {"mlp_out.bias", {d}}}) {
      shapes.emplace_back(p + name, shape);
    }
  }
  shapes.push_back({"ln_f.weight", {d}});
  shapes.push_back({"ln_f.bias", {d}});
  at::Generator gen = at::detail::createCPUGenerator(seed);
  NamedTensors theta;
  for (const auto& [name, shape] : shapes) theta.emplace_back(name, at::randn(shape, gen, at::kFloat) * 0.02);
  return theta;
}

// A fake validation loss: the mean of theta's squared elements (a value any change of theta changes).
class SumOfSquaresEvaluator : public Evaluator {
 public:
  double Evaluate(const NamedTensors& theta) override {
    double sum = 0;
    int64_t n = 0;
    for (const auto& [name, t] : theta) {
      sum += t.to(at::kDouble).pow(2).sum().item<double>();
      n += t.numel();
    }
    return sum / static_cast<double>(n);
  }
};

}  // namespace diloco
