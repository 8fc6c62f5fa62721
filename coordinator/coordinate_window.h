// CoordinateWindow: outer.aggregation trimmed_mean and centered_clip (issue 32) as streaming rules. The round's set
// of pushes is fixed first (Declare/TryOpen, as ClipGate does for clip); then chunk s of every push of the set is
// held until the last push of the set has sent its chunk s, the rule (aggregation_rule.h TrimmedMean, CenteredClip)
// reduces the k values of each coordinate of that chunk, and the result is handed back to be written into the round
// accumulator. A push may run at most window_chunks chunks ahead of the slowest push of the set (HasRoom); the core
// makes a push that has no room wait, and so gRPC flow control holds a fast pusher back. Memory: at most
// k x window_chunks chunks (docs/operations.md "Robust aggregation").
// Pushes are chunk-aligned: chunk s of every push must cover the same elements. The reference is the coordinator's
// own chunking (comm.codec and comm.chunk_bytes, as a worker's TensorChunker cuts each tensor: Options.chunk_elements),
// so a push cut otherwise is refused itself (Put), whichever push sent its chunk s first.
// The set holds only members that are still expected when it is fixed (a member lost or left after its header is
// not waited for); a member that joins again before the set is fixed is forgotten (Forget) and declares anew.
// Not thread-safe: the core guards it with its mutex.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "proto/diloco.pb.h"
#include "proto/tensor_spec.h"

namespace diloco {

// Whether `rule` is one of the coordinate-wise rules this class streams.
bool IsCoordinateWise(Aggregation rule);

class CoordinateWindow {
 public:
  struct Options {
    Aggregation rule = Aggregation::kTrimmedMean;
    int64_t trim = 1;              // trimmed_mean
    int64_t iterations = 3;        // centered_clip
    double tau = 0;                // centered_clip; 0: CenteredClipTau of each chunk
    int64_t window_chunks = 4;     // chunks a push may run ahead of the slowest
    size_t max_members = 1 << 20;  // the set never holds more pushes (each may hold an ingest thread)
    // Per model tensor, the elements of each of its wire chunks (the last may be shorter) and its elements; empty:
    // no reference, chunks are only compared with each other.
    std::vector<int64_t> chunk_elements;
    std::vector<int64_t> numel;
  };
  // One reduced chunk: `values` (float64) goes to elements [offset, offset + numel) of tensor `index`.
  struct Reduced {
    size_t index = 0;
    int64_t offset = 0;
    at::Tensor values;
  };

  explicit CoordinateWindow(Options options) : options_(options) {}

  // A push header of member `id` for the open round (idempotent).
  void Declare(const std::string& id) { declared_.insert(id); }
  // Member `id`'s header is forgotten (it joined again: its new process declares anew); no effect once open.
  void Forget(const std::string& id) {
    if (!open_) declared_.erase(id);
  }
  size_t declared() const { return declared_.size(); }
  // Fixes the set from the declared ids that are in `expected` (the members that may push now, distinct) when at least
  // max(min_declared, 1) of them have declared and either every id of `expected` has, `force`, or max_members have;
  // returns open().
  bool TryOpen(const std::vector<std::string>& expected, bool force, size_t min_declared);
  bool open() const { return open_; }
  size_t size() const { return members_.size(); }
  bool Holds(const std::string& id) const { return members_.count(id) != 0; }
  // The members of the set whose push has not finished (the round waits for them); whether `id` is one.
  std::vector<std::string> Unfinished() const;
  bool Waits(const std::string& id) const {
    auto it = members_.find(id);
    return it != members_.end() && !it->second.finished;
  }

  // Whether member `id` may hand in its next chunk now (it is fewer than window_chunks ahead of the slowest).
  bool HasRoom(const std::string& id) const;
  // Member `id`'s next chunk (its chunks in stream order; `values` is copied). Once every member has sent this
  // chunk, returns it reduced. INVALID_ARGUMENT when it is not the coordinator's chunk (Options.chunk_elements) or
  // does not line up with the other pushes' chunk.
  absl::StatusOr<std::optional<Reduced>> Put(const std::string& id, size_t index, int64_t offset,
                                             const at::Tensor& values);
  // Member `id`'s push ended complete; false when its chunk count differs from a member that ended before.
  bool Finish(const std::string& id);
  // Every member has finished and every chunk is reduced (the round may close).
  bool complete() const;
  // The members the window waits for: not finished and at the slowest position.
  std::vector<std::string> Laggards() const;
  int64_t reduced() const { return reduced_; }
  // When the window last advanced (opened or reduced a chunk), on the caller's clock: Touch sets it.
  double progress_at() const { return progress_at_; }
  void Touch(double now) { progress_at_ = now; }
  int64_t held_chunks() const;  // chunks stored, for tests
  // trimmed_mean: the share of the coordinates reduced so far at which member `id`'s value was dropped (0 before any
  // chunk is reduced, under centered_clip, or for an id not in the set). The suspect count's measure
  // (aggregation_rule.h TrimKeptScale).
  double TrimmedShare(const std::string& id) const;

  void Reset();  // the next round (or the redo after a restart): nothing declared, closed

 private:
  struct Member {
    int64_t next = 0;  // its next chunk's position in the stream
    bool finished = false;
  };
  struct Pending {
    size_t index = 0;
    int64_t offset = 0;
    int64_t count = 0;
    std::vector<at::Tensor> rows;  // by member slot; undefined until it arrives
    size_t arrived = 0;
  };
  at::Tensor Reduce(const at::Tensor& rows);

  Options options_;
  std::set<std::string> declared_;
  bool open_ = false;
  std::map<std::string, size_t> slots_;  // member id -> row
  std::map<std::string, Member> members_;
  std::map<int64_t, Pending> pending_;  // by chunk position
  int64_t reduced_ = 0;                 // chunks [0, reduced_) are reduced
  int64_t finished_count_ = -1;         // the chunk count of the first member that finished
  std::vector<int64_t> trimmed_;        // trimmed_mean: by member slot, the coordinates at which it was dropped
  int64_t coordinates_ = 0;             // the coordinates reduced so far (of one push)
  double progress_at_ = 0;
};

// The ingest threads a coordinator with `config` needs (ingest_queue.h): 2, or under a coordinate-wise rule in sync
// rounds workers.count + 2 (each push of the set may wait on its thread while the slowest catches up).
int IngestThreadsFor(const Config& config);
// The window's options from outer.* (max_members: one less than IngestThreadsFor, so a thread is always free) and
// the chunking of `specs` under comm.codec and comm.chunk_bytes (proto/tensor_chunks.h: a float32 tensor's chunks
// are encoded with comm.codec, any other dtype's are raw).
CoordinateWindow::Options CoordinateWindowOptionsOf(const Config& config, const std::vector<TensorSpec>& specs);
// Why a worker whose pushes come in `push_parts` part streams (comm.cluster_parts; JoinRequest.push_parts or
// PushHeader.parts) cannot push under `config`'s rule, in one line that names the worker's setting to change: clip
// (sync) takes one claimed norm per stream and the coordinate-wise rules reduce whole pushes chunk by chunk, so both
// take a push in one stream. Empty when push_parts <= 1 or the rule takes parts.
std::string PushPartsMismatch(const Config& config, int push_parts);
// Why a worker that pushes with `push_codec` in chunks of `chunk_bytes` (its comm.codec and comm.chunk_bytes, sent in
// JoinRequest) cannot be a member under `config`'s coordinate-wise rule, in one line: a codec that is not a dense
// push codec, or chunks of some tensor of `specs` that differ from the coordinator's. Empty when its chunks line up,
// when the rule is not coordinate-wise, or when chunk_bytes is 0 (not said: an older client).
std::string PushChunkingMismatch(const Config& config, const std::vector<TensorSpec>& specs, Codec push_codec,
                                 int64_t chunk_bytes);

}  // namespace diloco
