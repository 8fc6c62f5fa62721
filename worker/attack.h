// Attack: a test-only worker behaviour (diloco-worker --attack KIND[:FACTOR]) that turns this worker's honest push
// into one of the wrong pushes the coordinator's non-finite guard and robust aggregation must survive (issue 32
// item 5). For tests and scripts/bench only: a real worker never passes --attack. From the honest delta d of the
// round (after error feedback) and its token count:
//   scale:F   F x d                  (sign flip x1000: scale:-1000; x10: scale:10)
//   max:V     d scaled so that max|d| = V (a finite, well-formed push that overflows the coordinator's sums: 1e38)
//   random:F  a random direction with F x |d|
//   stale     the previous round's d (the first round: d itself)
//   tokens:F  d with F x its token count claimed
// Not thread-safe: the worker's round loop owns it.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/round_result.h"

namespace diloco {

struct AttackSpec {
  enum class Kind { kNone, kScale, kMax, kRandom, kStale, kTokens };
  Kind kind = Kind::kNone;
  double factor = 1;
};

// "" is kNone; else KIND[:FACTOR] as above (FACTOR required for scale, max, random, tokens), or InvalidArgument.
absl::StatusOr<AttackSpec> ParseAttack(const std::string& text);

class Attacker {
 public:
  explicit Attacker(AttackSpec spec, uint64_t seed = 1) : spec_(spec), seed_(seed) {}
  bool active() const { return spec_.kind != AttackSpec::Kind::kNone; }
  // Rewrites `result` (its pseudo-gradient, or its token count) per the spec.
  void Apply(RoundResult& result);

 private:
  AttackSpec spec_;
  uint64_t seed_;
  NamedTensors previous_;  // kStale: the previous round's honest delta
};

}  // namespace diloco
