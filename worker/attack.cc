#include "worker/attack.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

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
  if (spec.kind == AttackSpec::Kind::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("--attack '", text, "': KIND must be scale, max, random, stale or tokens (test-only)"));
  }
  if (needs_factor && (!absl::SimpleAtod(parts.second, &spec.factor) || !std::isfinite(spec.factor))) {
    return absl::InvalidArgumentError(absl::StrCat("--attack '", text, "': ", kind, " needs a finite :FACTOR"));
  }
  return spec;
}

void Attacker::Apply(RoundResult& result) {
  NamedTensors& delta = result.pseudo_gradient;
  switch (spec_.kind) {
    case AttackSpec::Kind::kNone:
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
    case AttackSpec::Kind::kTokens:
      result.report.tokens = static_cast<int64_t>(static_cast<double>(result.report.tokens) * spec_.factor);
      break;
  }
  spdlog::warn("test-only --attack: this push is not the honest one");
}

}  // namespace diloco
