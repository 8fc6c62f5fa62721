// TinyCoordinatorConfig: the config and validation data the CoordinatorCore unit tests share: a 1-layer, d_model 16
// model over a 64-token vocabulary, a synthetic validation shard written into `dir`, no evaluation or periodic
// checkpoints, rounds that close only when both of 2 workers pushed (no timeout). Tests change fields as they need.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/data_cache.h"
#include "worker/lm/token_shard.h"

namespace diloco {

inline Config TinyCoordinatorConfig(const std::filesystem::path& dir) {
  std::vector<uint32_t> ids(5000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>((i * 7919 + i / 13) % 64);
  std::string error;
  EXPECT_TRUE(WriteTokenShard(TokenCache{dir.string()}.val_path(), ids, 64, &error)) << error;
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

}  // namespace diloco
