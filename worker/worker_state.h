// WorkerState: what a worker keeps on its own disk so that a restart with the same --id resumes where it stopped
// instead of starting cold (the paper keeps each worker's inner optimizer state across rounds): its inner AdamW
// moments and step count, its data sampler's position and RNG, and the round of its last push.
//
// Files in workers.state_dir (default <run.output_dir>/worker-state), per worker id:
//   <id>.state     safetensors: "exp_avg", "exp_avg_sq" (flat float32, FlatAdamW's buffer order) and __metadata__
//                  {format: "diloco-worker-state-1", worker_id, fingerprint, seed, data, shard, shard_count, sampling,
//                  round, adam_steps, sampler_epoch, sampler_position, sampler_rng, cluster_rank, cluster_size,
//                  slice_layout}; with error feedback also "error_feedback.<fragment>" (flat float32 residuals);
//                  a cluster rank pushing its part (comm.cluster_parts) with error feedback keeps its slice of the
//                  residual as "slice_residual" instead (flat float32, its SlicePlan range's length).
//                  Written after every push (temp file, fsync, rename: a kill -9 leaves the old state or the new one).
// A rank r of a worker cluster (workers.cluster_size n > 1) keeps the same files under the key "<id>.rank-<r>"
// (StateKey): its own moments (with workers.sharding, its slice's only: slice_layout records SlicePlan's cut), its
// step, its data position, and its round; its previous state is kept as "<id>.rank-<r>.state.prev" so that the
// ranks can agree on a round they all saved (AgreeOnResumeRound) when a kill came between two ranks' writes.
//   <id>.position  the sampler's state after the latest inner step (the same identity keys and sampler keys as JSON),
//                  replaced by rename after every step (no fsync): windows drawn in a round that a kill cut short are
//                  not drawn again after the restart.
//   <id>.windows   with data.trace_windows: one line "epoch start" per training window drawn (appended).
// A saved state is used only when it belongs to this run (WhyNotResume). Plain functions and data; thread-safe for
// distinct paths.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/window_sampler.h"

namespace diloco {

// Who a state belongs to: a state is resumed only into the same identity.
struct StateIdentity {
  std::string worker_id;
  std::string fingerprint;  // the model's (proto/tensor_spec.h Fingerprint)
  int64_t seed = 0;         // run.seed
  std::string data;         // the token cache the shard comes from (its directory name: inputs + tokenizer + split)
  int64_t shard = 0, shard_count = 1;
  std::string sampling;  // data.sampling
  // A worker cluster's rank (0 of 1 for a one-process worker) and its optimizer's cut (SliceLayout): a state is
  // resumed only by the same rank of a cluster of the same size and the same workers.sharding and slice layout.
  int64_t cluster_rank = 0, cluster_size = 1;
  std::string slice_layout = "none";
  // The windows a data position counts (WindowsOf): "seq_len <N>, data.split <S>" (a cluster's rank: then ", the
  // shard cut among <n> ranks"). A position is resumed only into the same windows (the moments are resumed either way);
  // "" in a file saved before it was recorded (not compared).
  std::string windows;
};

struct WorkerState {
  StateIdentity identity;
  int64_t round = 0;       // the round (1-based) of the worker's last push
  int64_t adam_steps = 0;  // FlatAdamW::steps()
  SamplerState sampler;
  torch::Tensor exp_avg, exp_avg_sq;  // flat float32
  // comm.error_feedback / codec topk: each fragment's residual, its tensors flattened and concatenated in push order
  // (float32); undefined for a fragment with none yet. Saved as "error_feedback.<fragment>".
  std::vector<torch::Tensor> error_feedback;
  // comm.cluster_parts: this rank's slice of the residual (worker/part_exchange.h); undefined when it holds none.
  torch::Tensor slice_residual;
};

// The key of a worker's files: its id, or "<id>.rank-<r>" for rank r of a cluster of cluster_size > 1.
std::string StateKey(const std::string& worker_id, int64_t cluster_rank, int64_t cluster_size);
// The paths below take a StateKey (a one-process worker's is its id).
std::string StatePath(const std::string& dir, const std::string& worker_id);
std::string PreviousStatePath(const std::string& dir, const std::string& worker_id);  // a cluster rank's last but one
std::string PositionPath(const std::string& dir, const std::string& worker_id);
std::string WindowsPath(const std::string& dir, const std::string& worker_id);

// Why `saved` cannot resume into `current` ("" when it can): the first key that differs, with both values.
std::string WhyNotResume(const StateIdentity& saved, const StateIdentity& current);
// Why the data position of `saved` cannot resume into `current` although its state can ("" when it can): the windows
// differ (model.seq_len or data.split changed), so its window count would name other tokens.
std::string WhyNotResumePosition(const StateIdentity& saved, const StateIdentity& current);
// StateIdentity::windows of a worker training windows of `seq_len` tokens cut by `split` (data.split's name), one
// of `ranks` ranks of a worker cluster (MakeRankLayout; their cut before it was not recorded: not resumed).
std::string WindowsOf(int64_t seq_len, const std::string& split, int64_t ranks = 1);

// The optimizer's slice layout as a state records it: "none" unsharded; sharded "<sharding> <N> in <n> slices of
// <S>" (workers.sharding, the parameters, SlicePlan's parts and slice length).
std::string SliceLayout(int64_t numel, bool sharded, bool own_gradient_slice, int64_t parts, int64_t slice_length);

// A saved state as a cluster's ranks compare them: its round and AdamW step count. A round number alone does not name
// one save: a coordinator restarted from an older checkpoint makes the cluster train and save a round again, at a
// later step.
struct SaveMark {
  int64_t round = 0;
  int64_t adam_steps = 0;
  bool operator==(const SaveMark& o) const { return round == o.round && adam_steps == o.adam_steps; }
};
// The save a cluster's ranks resume their optimizer state from: the newest (round, then step) that every rank has a
// usable state of (each rank's list: the marks of its state and previous state that fit this run). nullopt when there
// is none (every rank starts its moments fresh); the reason names each rank's marks ("round@step").
struct ResumeAgreement {
  std::optional<SaveMark> mark;
  std::string reason;
};
ResumeAgreement AgreeOnResumeRound(const std::vector<std::vector<SaveMark>>& marks_per_rank);
// "round@step" (as ranks share their marks and the reasons name them), and back (nullopt when not one).
std::string MarkText(const SaveMark& mark);
std::optional<SaveMark> ParseMark(absl::string_view text);

absl::Status SaveWorkerState(const std::string& path, const WorkerState& state);
// NotFound when there is no file; DataLoss/InvalidArgument (naming the file) for a damaged or foreign one.
absl::StatusOr<WorkerState> LoadWorkerState(const std::string& path);

// The sampler journal: identity and sampler state only, no fsync (see above).
absl::Status SavePosition(const std::string& path, const StateIdentity& identity, const SamplerState& sampler);
absl::StatusOr<std::pair<StateIdentity, SamplerState>> LoadPosition(const std::string& path);

}  // namespace diloco
