// WorkerCluster: the processes of one DiLoCo worker when workers.cluster_size = n > 1 (DESIGN: a "worker" of the
// paper is a cluster doing ordinary data parallel inside). Rank 0, the leader, talks to the coordinator (with
// comm.cluster_parts every rank also pushes and pulls its slice: worker/part_exchange.h); all n
// ranks rendezvous through a c10d TCPStore (hosted by rank 0 at --cluster-store HOST:PORT) and a c10d process group
// (worker/collective_group.h: Gloo for ranks on the CPU, NCCL for ranks on CUDA devices), and every inner step
// averages their gradients in place in the inner optimizer's flat gradient buffer (one collective on the device), so
// their parameters stay identical. The leader drives the followers with commands (worker/cluster_protocol.h: load
// theta, train n steps, merge a fragment, stop) that travel through the store, not a collective: between two
// commands the leader may wait for a whole round (push, the round's close, pull), far longer than the collective
// timeout, after which NCCL aborts the process (SIGABRT) where Gloo throws. So a follower waits for command `seq` by
// polling the store's key `cmd/<seq>` (a non-blocking check every few ms, backing off to 100 ms, each counted in
// `polls/<rank>`), which throws as soon as the leader, the store's host, is gone; it then acknowledges it
// (`ack/<seq>/<rank>`), and the leader starts the command's collectives only once every follower has. While a
// follower works on a command (a 404 MB broadcast on a loaded machine, a part's push) it does not poll, so each
// follower also heartbeats: a thread of its own, on its own connection to the store, adds to `polls/<rank>` every
// tenth of the silence limit for as long as the process lives. The leader throws when a follower has not taken a
// command within workers.cluster_timeout_s, or when its `polls/<rank>` has not moved for longest_silence (10 s: a
// dead process, not a busy one). A dead rank makes the next collective or command throw (Gloo
// sees the connection close, NCCL its timeout), which takes the whole cluster out of the run; restarted, it joins again
// as the same worker. With workers.sharding (the trainer's FlatAdamW holds one slice, worker/flat_adamw.h) the inner
// step is ZeRO's instead: reduce-scatter of the gradients into each rank's slice, one all-reduce of the squared slice
// norms (global clipping) and the stop wishes, AdamW on the slice, all-gather of the parameters.
// Not thread-safe: one thread of each process calls it (the inner loop's thread); the heartbeat thread (ranks > 0)
// touches only its own store connection and is joined by the destructor.
#pragma once

#include <torch/torch.h>

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"

namespace diloco {

class CollectiveGroup;
class FlatAdamW;
class GradientBuckets;
class InnerTrainer;

class WorkerCluster {
 public:
  // Rendezvous of `size` ranks; rank 0 hosts the store at store_address (HOST:PORT). Blocks until all have come or
  // timeout_s passes (then an error naming the store). On a CUDA `device` the ranks use NCCL, else Gloo, whose
  // connections bind to bind_host, this rank's own address (default: the store's host, right when all ranks share
  // a machine). longest_silence: how long the leader waits for a sign of life of a follower that has not taken a
  // command (a follower heartbeats every tenth of it); tests shorten it.
  static constexpr std::chrono::milliseconds kLongestSilence{10000};
  // How long the leader waits for followers that heartbeat while they build their trainer (the shard command).
  static constexpr std::chrono::milliseconds kLongestTrainerBuild{3600 * 1000};
  static absl::StatusOr<std::unique_ptr<WorkerCluster>> Connect(
      int rank, int size, const std::string& store_address, double timeout_s, const std::string& bind_host = "",
      torch::Device device = torch::kCPU, std::chrono::milliseconds longest_silence = kLongestSilence);
  ~WorkerCluster();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Seconds spent waiting in AverageGradients' all-reduce (communication and waiting for slower ranks).
  double collective_seconds() const { return collective_seconds_; }
  // CollectiveGroup::native_reduce_scatter: whether the reduce-scatters so far were the backend's own.
  bool native_reduce_scatter() const;

  // Averages the flat gradient buffer over the ranks, in place on its device, and ORs the ranks' stop wishes (one
  // coalesced all-reduce of both). Returns whether any rank wants to stop. Throws on a dead peer.
  bool AverageGradients(const torch::Tensor& flat_gradients, bool want_stop);

  // Rank 0's float32 tensors (CPU or the cluster's device) overwrite the others' (the same shapes; each rank's may be
  // on another device or laid out otherwise): those of 2^24 elements or more one by one (in place when contiguous
  // float32 on the cluster's device, else through a temporary there), the rest packed into broadcasts of a staging
  // buffer of 64 MiB.
  void Broadcast(std::vector<torch::Tensor>& tensors);
  // The carrier of worker/cluster_protocol.h's commands, in order (the n-th sent is the n-th received).
  // Rank 0: publishes `words` as the next command and returns once every other rank has acknowledged it; throws if
  // one has not within the cluster's timeout, or its polls and heartbeats stopped for longest_silence without.
  // `wait_while_heard`: kLongestTrainerBuild instead of the timeout while its heartbeats go on (the shard command: a
  // follower acknowledges it once it has built its trainer, which for a large model takes longer than the timeout).
  // Ranks > 0: ReceiveWords waits as long as rank 0 lives for its next command (throws once rank 0, the store's host,
  // is gone); Acknowledge then tells rank 0 this rank has taken it (before the command's collectives).
  void SendWords(const std::array<int64_t, 4>& words, bool wait_while_heard = false);
  std::array<int64_t, 4> ReceiveWords();
  void Acknowledge();

  // Publishes `mine` in the store under "<topic>/<rank>" and returns every rank's line, in rank order (each waited
  // for up to the cluster's timeout). Throws when a rank's never comes. For what the ranks agree on at start
  // (worker/local_state.h: the round they resume).
  std::vector<std::string> ShareWithRanks(const std::string& topic, const std::string& mine);

  // Checks that this rank's parameters are bitwise identical to rank 0's (a checksum broadcast by rank 0);
  // throws naming the step if not. For workers.check_replicas.
  void CheckReplicas(const std::vector<torch::Tensor>& params, int64_t step);
  int64_t replica_checks() const { return replica_checks_; }  // CheckReplicas calls that passed

  // Makes `trainer` a rank of this cluster: its gradients are averaged over the ranks every inner step (sharded:
  // the ZeRO step above), and with check_replicas every step ends with CheckReplicas. The cluster must outlive the
  // trainer's training calls. First every rank publishes its sharding and slice layout in the store and compares the
  // others': an error naming both ranks' layouts when they differ (ranks started with different configs).
  absl::Status AttachTo(InnerTrainer& trainer, bool check_replicas);

  // The sharded step's collectives (AttachTo installs them; public for tests). ReduceScatterGradients: this rank's
  // piece of the averaged gradients into the optimizer's gradient piece, then one all-reduce of [squared slice norm,
  // stop wish]; returns whether any rank wants to stop. squared_gradient_norm: the sum of the squared slice norms
  // (the whole gradient's squared norm) from its last call. GatherParameters: every rank's stepped slice to all.
  // A bucketed optimizer (FlatShard::bucketed) needs InstallGradientBuckets first (AttachTo does it): its reductions
  // then run during backward, and ReduceScatterGradients reduces what is left.
  bool ReduceScatterGradients(FlatAdamW& optimizer, bool want_stop);
  void InstallGradientBuckets(FlatAdamW& optimizer, std::vector<torch::Tensor> params, int64_t bucket_elements);
  const torch::Tensor& squared_gradient_norm() const { return squared_norm_; }
  void GatherParameters(FlatAdamW& optimizer);

  // comm.cluster_parts (worker/part_exchange.h). AllGather: every rank's `mine` (S elements, on the group's device)
  // into piece r of `all` (n * S) on every rank. Put/Take: a small value under `key` in the cluster's store (a
  // rank's part outcome, the push header); Take polls until it is there (throws once the store's host is gone, or
  // after `timeout`) and deletes it.
  void AllGather(torch::Tensor& mine, torch::Tensor& all);
  void Put(const std::string& key, const std::string& value);
  std::string Take(const std::string& key, std::chrono::milliseconds timeout);
  // Rank 0: Take of a value follower `rank` puts when its work is done (its part's push or pull, which streams for
  // as long as its link needs: the stream has its own no-progress deadline, workers.rpc_timeout_s). Waits while the
  // follower lives (its polls or heartbeats move), at most kLongestPartExchange; throws when it has been silent for
  // longest_silence (dead) or the store's host is gone.
  std::string TakeFromLiving(int rank, const std::string& key);
  static constexpr std::chrono::milliseconds kLongestPartExchange{6 * 3600 * 1000};

 private:
  WorkerCluster(int rank, int size, std::chrono::milliseconds timeout, std::chrono::milliseconds longest_silence);
  void WaitUntilTaken(int64_t seq, bool wait_while_heard);  // rank 0: every follower's acknowledgement of seq
  // Ranks > 0: starts the heartbeat thread on a second client of the store at host:port.
  void StartHeartbeat(const std::string& host, uint16_t port);
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;          // workers.cluster_timeout_s: rendezvous, collectives, taking a command
  std::chrono::milliseconds longest_silence_;  // rank 0: a follower silent this long (no poll, no heartbeat) is dead
  c10::intrusive_ptr<c10d::Store> commands_;   // the cluster's store under the prefix "diloco/"
  int64_t command_seq_ = 0;                    // the next command's number (the same on every rank)
  std::unique_ptr<CollectiveGroup> group_;
  std::unique_ptr<GradientBuckets> buckets_;  // bucketed optimizers (worker/gradient_buckets.h)
  // Runs `collective` and adds its duration to collective_seconds_ (on a GPU, between device syncs).
  void Timed(const std::function<void()>& collective);
  // Publishes `mine` under "<topic>/<rank>" and checks every other rank's against it (AttachTo: the slice layout,
  // the shared config): `differs(r, theirs)` says how rank r's differs ("" when alike), for the error.
  absl::Status CompareWithRanks(const std::string& topic, const std::string& mine,
                                const std::function<std::string(int, const std::string&)>& differs);
  torch::Tensor stop_flag_;     // one float on the group's device: the ranks' stop wishes, summed
  torch::Tensor squared_norm_;  // sharded: [1] on the group's device, the whole gradient's squared norm
  double collective_seconds_ = 0;
  int64_t replica_checks_ = 0;
  absl::Notification stop_heartbeat_;  // the destructor's signal to the heartbeat thread
  std::thread heartbeat_;              // ranks > 0: adds to polls/<rank> every longest_silence_ / 10
};

}  // namespace diloco
