// Strict YAML loading of Config: every key of the file and of each `--set a.b=value` override must be a known
// field of the right type with an allowed value, or loading fails with one line naming the file, the key and what is
// allowed. Also renders the resolved config (for the start-up log) and its hash. Every key (its type, range and doc)
// is one row of Fields() (config_fields.h); docs/configuration.md is generated from it. Stateless functions;
// thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"

namespace diloco {

// Reads `path` (must exist), applies `overrides` ("section.key=value", YAML scalar syntax), validates.
absl::StatusOr<Config> LoadConfig(const std::string& path, const std::vector<std::string>& overrides = {});

// Only the security: section of a run's file and the security.* overrides (the others are not read), validated as
// LoadConfig validates it: for diloco-ctl's status / leave / checkpoint, which may run where the run's data and
// model paths do not exist.
absl::StatusOr<SecurityConfig> LoadSecurityConfig(const std::string& path,
                                                  const std::vector<std::string>& overrides = {});

// Same as LoadConfig, from YAML text (for tests); `origin` names the source in error messages.
absl::StatusOr<Config> ParseConfig(const std::string& yaml_text, const std::string& origin,
                                   const std::vector<std::string>& overrides = {});

// Every key's range from its row of Fields() (positive sizes, [0, 1) momentum, device names, ...), then the cross-key
// rules (d_model divisible by n_head, fragments dividing inner.steps, ...) and the files (tokenizer, TLS, token).
absl::Status ValidateConfig(const Config& config);

// "section.key: value" lines in schema order.
std::string RenderConfig(const Config& config);

// 16 hex digits over RenderConfig().
std::string ConfigHash(const Config& config);

// RenderConfig's lines of the keys every rank of a worker cluster must share: what decides the collectives a step
// issues and the math of its replicas (model.* but init_from and activation_checkpointing, inner.* but
// micro_batch_size, comm.* but tcp_port, workers.cluster_size, sharding, check_replicas, precision and allow_tf32).
// Paths, devices, threads, timeouts and the memory knobs may differ from machine to machine (whether micro-batches
// bucket the gradients, which changes the collectives, is in the cluster's layout line instead).
std::string RenderClusterConfig(const Config& config);
// How the rendered config `mine` differs from `theirs` (both RenderConfig-style lines), naming `them`:
// "inner.micro_batch_size 1 where rank 0 has 4 (and 2 more keys)"; "" when they are alike.
std::string ConfigDifference(const std::string& mine, const std::string& theirs, const std::string& them);

// Every key with its default as RenderConfig prints it, in schema order.
std::vector<std::pair<std::string, std::string>> ConfigKeysWithDefaults();

}  // namespace diloco
