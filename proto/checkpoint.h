// Coordinator checkpoints (lives in proto/: the coordinator writes them; ctl export and the data-parallel baseline
// in worker/ read them): the global parameters theta_t, the outer momentum, the round t and the evaluation
// history, in one self-checking file.
//
// Format (little endian): magic "DLCOCKPT", uint32 version (5), int64 round, string fingerprint, uint32 tensor count,
// per tensor {string name, uint32 ndim, int64 dims[ndim], float32 data}, uint32 momentum count (0 or tensor count),
// per momentum tensor float32 data, uint32 eval count, per eval {int64 round, float64 val_loss,
// int64 tokens, int64 bytes_pushed_committed} (version 1: without the last two; still loaded), then (version 3) uint64
// theta_id, string members_config, uint32 member count, per member {string id, int32 shard_index, int32 shard_reader,
// int32 cluster_size, int64 inner_steps, int64 last_applied_base, (version 4) uint8 active, (version 5) int64
// rounds_contributed, int64 tokens, int64 bytes_pushed} (versions 1 and 2: none), then (version 4) uint32 count, per
// earlier theta {int64 round, uint64 theta_id}, then (version 5) the run totals {uint8 recorded, int64
// tokens_committed, int64 bytes_pushed_committed, int64 dp_equivalent_bytes}, then an xxHash64 of every byte
// before it. Strings are uint32 length + bytes. Writes go to "<path>.tmp", are fsynced, renamed over <path>, and
// the directory is fsynced: a crash leaves the old file or the new one, never a torn one. Loading checks magic,
// version, sizes and the checksum. Neither holds a whole-file image in memory: writes go through a 1 MiB buffer
// straight from the tensors; loads read the small fields first, then the tensors' data with parallel preads straight
// into them (O_DIRECT for each tensor's 4 KiB-aligned interior, whose memory is placed for it; the page cache where the
// file system refuses O_DIRECT), then verify the checksum. Loaded tensors own memory from aligned_alloc (not LibTorch's
// allocator: they cannot be resized). Stateless functions; thread-safe for distinct paths.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/named_tensors.h"

namespace diloco {

struct EvalRecord {
  int64_t round = 0;
  double val_loss = 0;
  int64_t tokens = 0;                  // tokens trained by all workers up to this evaluation (version 2)
  int64_t bytes_pushed_committed = 0;  // pseudo-gradient bytes of the rounds committed so far (version 2)
};

// A member of the run as the checkpoint's round committed (coordinator/membership.h), active or lost (not one that
// left), so that a restarted coordinator expects the active ones and still knows which pushes of each counted.
struct MemberRecord {
  std::string id;
  int32_t shard_index = 0;
  int32_t shard_reader = 0;
  int32_t cluster_size = 1;
  int64_t inner_steps = 0;         // its H for the next round (inner.adaptive_steps); 0 = inner.steps
  int64_t last_applied_base = -1;  // the newest round one of its counted pushes was computed against
  bool active = true;              // false: lost (its lease ran out, or restored and not joined again); version 3: true
  // Version 5: what it contributed to the committed rounds (status and summary.json go on from these after a
  // restart); 0 in older files.
  int64_t rounds_contributed = 0;
  int64_t tokens = 0;
  int64_t bytes_pushed = 0;
};

// Version 5: the run's totals over its committed rounds, as of the checkpoint's round. Before, a restart took the
// tokens and bytes from the newest evaluation record (only when it was of that round) and the data-parallel figure
// from nowhere: they started over from 0.
struct RunTotalsRecord {
  int64_t tokens_committed = 0;
  int64_t bytes_pushed_committed = 0;
  int64_t dp_equivalent_bytes = 0;
};

// The id of a theta before the checkpoint's round that a push may still be computed against (outer.mode async).
struct ThetaIdRecord {
  int64_t round = 0;
  uint64_t id = 0;
};

struct CheckpointData {
  int64_t round = 0;
  std::string fingerprint;
  NamedTensors params;               // float32
  std::vector<at::Tensor> momentum;  // empty or one per param
  std::vector<EvalRecord> evals;
  uint64_t theta_id = 0;              // theta_round's id (PullHeader.theta_id; 0: none, version 1 and 2 files)
  std::string members_config;         // the coordinator's ConfigHash the members joined under ("": none recorded)
  std::vector<MemberRecord> members;  // version 3
  // Version 4: the ids of the thetas of the rounds before `round` that pushes may still be computed against (async:
  // up to outer.max_staleness back; sync: none), oldest first, so that a restart refuses a push against another theta
  // of those rounds too (PullHeader.theta_id).
  std::vector<ThetaIdRecord> earlier_theta_ids;
  std::optional<RunTotalsRecord> totals;  // version 5 (unset: an older file, or not recorded)
};

absl::Status SaveCheckpoint(const std::string& path, const CheckpointData& data);
absl::StatusOr<CheckpointData> LoadCheckpoint(const std::string& path);

struct LoadedCheckpoint {
  std::string path;
  CheckpointData data;
};

// The newest checkpoint in `dir` that loads and verifies. Corrupt files are skipped and described in *skipped
// ("path: reason"); one that cannot be opened at all (permissions, I/O) or that a newer diloco wrote (its format
// version above this build's) is FailedPrecondition naming it, not skipped.
// NotFound when the directory holds no valid checkpoint.
absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& dir, std::vector<std::string>* skipped);

// "<dir>/ckpt-<round, 8 digits>.bin"
std::string CheckpointPath(const std::string& dir, int64_t round);

// Deletes all but the newest `keep` checkpoints in dir (keep 0 keeps all).
void PruneCheckpoints(const std::string& dir, int64_t keep);

// A run started over (--fresh) in a directory that holds another run's checkpoints: moves them into
// <dir>/before-fresh-<UTC time>/ (never deleted: pruning and resuming would otherwise mix the two runs, and a new run
// of fewer rounds would see its own newest checkpoints pruned as the oldest names). Returns that folder, "" when
// there was nothing to move, or the error (nothing is then half moved back: the files moved so far are named in it).
absl::StatusOr<std::string> SetAsideCheckpoints(const std::string& dir);

// Deletes the "<dir>/ckpt-*.bin.tmp" files a save killed before its rename left (never a valid checkpoint); returns
// how many.
int RemoveUnfinishedCheckpoints(const std::string& dir);

}  // namespace diloco
