// Attack: a test-only worker behaviour (diloco-worker --attack KIND[:FACTOR]) that turns this worker's honest push
// into one of the wrong pushes the coordinator's non-finite guard and robust aggregation must survive (issue 32
// item 5). For tests and scripts/bench only: a real worker never passes --attack. From the honest delta d of the
// round (after error feedback) and its token count:
//   scale:F   F x d                  (sign flip x1000: scale:-1000; x10: scale:10)
//   max:V     d scaled so that max|d| = V (a finite, well-formed push that overflows the coordinator's sums: 1e38)
//   random:F  a random direction with F x |d|
//   stale     the previous round's d (the first round: d itself)
//   tokens:F  d with F x its token count claimed
//   copy:PATH another worker's d of the same round (a free rider's or a Sybil's push: well-formed, honest-looking,
//             but not its own work). That worker runs with the test-only --dump-delta PATH, which writes each pushed
//             d to PATH (DumpDelta: the checkpoint format of proto/checkpoint.h, its round in the header, written
//             to PATH.tmp and renamed). The copier waits up to copy_wait_ms for PATH to hold its own round (the
//             workers of a synchronous round train side by side; the dumper writes before it pushes, so the wait
//             cannot deadlock), then pushes that d with its own token count. A file that never reaches the round
//             gives the newest one found; none, or names/shapes that differ (another fragment), give the honest d
//             with a warning. Chosen over training on the named worker's shard: the Join reply assigns shards and
//             the inner loop's sampling differs per worker, so that would be a near-copy at best.
//   nan-step:N not a push attack but a training fault: the loss of global inner step N (0-based), the first time
//             it is trained, is made NaN before its backward (InnerTrainer::set_step_fault), so the round's training
//             turns non-finite as a divergence would; the worker must say so, start its moments over (every rank of a
//             cluster) and train on.
//   throw-step:N another training fault: global inner step N, the first time it is trained, throws as a device
//             error (CUDA out of memory) would; a one-process worker must leave with `worker failed: ...` (exit 1).
// Not thread-safe: the worker's round loop owns it.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/round_result.h"

namespace diloco {

struct AttackSpec {
  enum class Kind { kNone, kScale, kMax, kRandom, kStale, kTokens, kCopy, kNanStep, kThrowStep };
  Kind kind = Kind::kNone;
  double factor = 1;
  std::string copy_path;          // kCopy: the file another worker's --dump-delta writes
  int64_t fault_step = -1;        // kNanStep, kThrowStep: the global inner step that fails
  int64_t copy_wait_ms = 600000;  // kCopy: how long to wait for the file to hold this round
};

// "" is kNone; else KIND[:FACTOR] as above (FACTOR required for scale, max, random, tokens; copy:PATH needs a PATH),
// or InvalidArgument.
absl::StatusOr<AttackSpec> ParseAttack(const std::string& text);

// --dump-delta: writes `delta`, pushed in `round`, to `path` atomically (the format copy:PATH reads).
absl::Status DumpDelta(const std::string& path, int64_t round, const NamedTensors& delta);

class Attacker {
 public:
  explicit Attacker(AttackSpec spec, uint64_t seed = 1) : spec_(spec), seed_(seed) {}
  bool active() const { return spec_.kind != AttackSpec::Kind::kNone; }
  // Rewrites `result` (its pseudo-gradient, or its token count), pushed in `round`, per the spec.
  void Apply(RoundResult& result, int64_t round);

 private:
  // kCopy: replaces `delta` with the copied worker's of `round` (see above); false when it kept the honest one.
  bool CopyInto(NamedTensors& delta, int64_t round) const;

  AttackSpec spec_;
  uint64_t seed_;
  NamedTensors previous_;  // kStale: the previous round's honest delta
};

}  // namespace diloco
