#include "worker/attack.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "proto/checkpoint.h"

namespace diloco {

absl::StatusOr<AttackSpec> ParseAttack(const std::string& text) {
  AttackSpec spec;
  if (text.empty()) return spec;
  const std::pair<std::string, std::string> parts = absl::StrSplit(text, absl::MaxSplits(':', 1));
  const std::string& kind = parts.first;
  const bool needs_factor = kind == "scale" || kind == "max" || kind == "random" || kind == "tokens";
  if (kind == "scale") spec.kind = AttackSpec::Kind::kScale;
  if (kind == "max") spec.kind = AttackSpec::Kind::kMax;
  if (kind == "random") spec.kind = AttackSpec::Kind::kRandom;
  if (kind == "stale") spec.kind = AttackSpec::Kind::kStale;
  if (kind == "tokens") spec.kind = AttackSpec::Kind::kTokens;
  if (kind == "copy") spec.kind = AttackSpec::Kind::kCopy;
  if (kind == "nan-step") spec.kind = AttackSpec::Kind::kNanStep;
  if (kind == "throw-step") spec.kind = AttackSpec::Kind::kThrowStep;
  if (spec.kind == AttackSpec::Kind::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("--attack '", text,
                     "': KIND must be scale, max, random, stale, tokens, copy, nan-step or throw-step (test-only)"));
  }
  if (spec.kind == AttackSpec::Kind::kNanStep || spec.kind == AttackSpec::Kind::kThrowStep) {
    if (!absl::SimpleAtoi(parts.second, &spec.fault_step) || spec.fault_step < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--attack '", text, "': ", kind, " needs :N, an inner step >= 0"));
    }
    return spec;
  }
  if (spec.kind == AttackSpec::Kind::kCopy) {
    if (parts.second.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--attack '", text,
                                                     "': copy needs :PATH (another worker's "
                                                     "--dump-delta file)"));
    }
    spec.copy_path = parts.second;
    return spec;
  }
  if (needs_factor && (!absl::SimpleAtod(parts.second, &spec.factor) || !std::isfinite(spec.factor))) {
    return absl::InvalidArgumentError(absl::StrCat("--attack '", text, "': ", kind, " needs a finite :FACTOR"));
  }
  return spec;
}

namespace {

constexpr char kDeltaFingerprint[] = "diloco-worker --dump-delta";

// Same names and shapes, in the same order.
bool SameLayout(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || !a[i].second.sizes().equals(b[i].second.sizes())) return false;
  }
  return true;
}

}  // namespace

absl::Status DumpDelta(const std::string& path, int64_t round, const NamedTensors& delta) {
  CheckpointData data;
  data.round = round;
  data.fingerprint = kDeltaFingerprint;
  for (const auto& [name, d] : delta) data.params.emplace_back(name, d.to(at::kFloat).contiguous());
  return SaveCheckpoint(path, data);
}

bool Attacker::CopyInto(NamedTensors& delta, int64_t round) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(spec_.copy_wait_ms);
  std::optional<CheckpointData> newest;
  while (true) {
    if (std::filesystem::exists(spec_.copy_path)) {
      absl::StatusOr<CheckpointData> loaded = LoadCheckpoint(spec_.copy_path);  // renamed in whole: never torn
      if (loaded.ok() && loaded->fingerprint == kDeltaFingerprint) newest = std::move(*loaded);
    }
    if ((newest && newest->round >= round) || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!newest || !SameLayout(newest->params, delta)) {
    spdlog::warn("test-only --attack copy: {} holds no delta of this layout; pushing the honest one", spec_.copy_path);
    return false;
  }
  if (newest->round != round) {
    spdlog::warn("test-only --attack copy: {} holds round {}, not {}; copying it", spec_.copy_path, newest->round + 1,
                 round + 1);
  }
  delta = std::move(newest->params);
  return true;
}

void Attacker::Apply(RoundResult& result, int64_t round) {
  NamedTensors& delta = result.pseudo_gradient;
  switch (spec_.kind) {
    case AttackSpec::Kind::kNone:
    case AttackSpec::Kind::kNanStep:  // training faults (InnerTrainer::set_step_fault): the push is the honest one
    case AttackSpec::Kind::kThrowStep:
      return;
    case AttackSpec::Kind::kScale:
      for (auto& [name, d] : delta) d = d * spec_.factor;
      break;
    case AttackSpec::Kind::kMax: {
      double max_abs = 0;
      for (const auto& [name, d] : delta) max_abs = std::max(max_abs, d.abs().max().item<double>());
      // In float64, then to float32: factor / max_abs may itself not fit a float.
      for (auto& [name, d] : delta) d = (d.to(at::kDouble) * (spec_.factor / max_abs)).to(at::kFloat);
      break;
    }
    case AttackSpec::Kind::kRandom: {
      double squared = 0;
      for (const auto& [name, d] : delta) squared += d.to(at::kDouble).square().sum().item<double>();
      at::Generator gen = at::detail::createCPUGenerator(seed_++);
      NamedTensors noise;
      double noise_squared = 0;
      for (const auto& [name, d] : delta) {
        noise.emplace_back(name, at::normal(0.0, 1.0, d.sizes(), gen, d.options()));
        noise_squared += noise.back().second.to(at::kDouble).square().sum().item<double>();
      }
      const double scale = spec_.factor * std::sqrt(squared / noise_squared);
      for (size_t i = 0; i < delta.size(); ++i) delta[i].second = noise[i].second * scale;
      break;
    }
    case AttackSpec::Kind::kStale: {
      NamedTensors honest;
      for (const auto& [name, d] : delta) honest.emplace_back(name, d.clone());
      if (!previous_.empty() && previous_.size() == delta.size()) delta = std::move(previous_);
      previous_ = std::move(honest);
      break;
    }
    case AttackSpec::Kind::kCopy:
      if (!CopyInto(delta, round)) return;
      break;
    case AttackSpec::Kind::kTokens:
      result.report.tokens = static_cast<int64_t>(static_cast<double>(result.report.tokens) * spec_.factor);
      break;
  }
  spdlog::warn("test-only --attack: this push is not the honest one");
}

}  // namespace diloco
