#include "worker/cluster.h"

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "config/config_loader.h"
#include "worker/collective_group.h"
#include "worker/flat_adamw.h"
#include "worker/gradient_buckets.h"
#include "worker/trainer.h"

namespace diloco {

namespace {

using std::chrono::milliseconds;

// Waiting for a command or its acknowledgements: the first polls come quickly (commands come in bursts: load, then
// train), later ones every 100 ms (a follower waiting out a whole round costs the store 10 checks a second).
constexpr milliseconds kFirstPoll{1};
constexpr milliseconds kLongestPoll{100};

// The largest temporary of a broadcast of many tensors (Broadcast): 16 Mi floats, 64 MiB.
constexpr int64_t kStagingElements = int64_t{1} << 24;

// Bucketed gradients (worker/gradient_buckets.h): 4 Mi floats (16 MiB) of parameters per bucket.
constexpr int64_t kBucketElements = int64_t{1} << 22;

std::string CommandKey(const char* what, int64_t n) { return absl::StrCat(what, "/", n); }
std::string AckKey(int64_t seq, int rank) { return absl::StrCat("ack/", seq, "/", rank); }

void Sleep(milliseconds& poll) {
  std::this_thread::sleep_for(poll);
  poll = std::min(poll * 2, kLongestPoll);
}

}  // namespace

WorkerCluster::WorkerCluster(int rank, int size, milliseconds timeout, milliseconds longest_silence)
    : rank_(rank), size_(size), timeout_(timeout), longest_silence_(longest_silence) {}

bool WorkerCluster::native_reduce_scatter() const { return group_->native_reduce_scatter(); }

void WorkerCluster::Timed(const std::function<void()>& collective) {
  // NCCL's wait() only orders the current stream after the collective: the host returns at once. On a GPU the clock
  // runs from the moment the work before it is done to the moment the collective is (two device syncs a step;
  // the step's .item() synchronises anyway), or the figure reads about 0.
  const bool cuda = group_->device().is_cuda();
  if (cuda) torch::cuda::synchronize(group_->device().index());
  const auto t0 = std::chrono::steady_clock::now();
  collective();
  if (cuda) torch::cuda::synchronize(group_->device().index());
  collective_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

WorkerCluster::~WorkerCluster() {
  stop_heartbeat_.Notify();
  if (heartbeat_.joinable()) heartbeat_.join();
}

void WorkerCluster::StartHeartbeat(const std::string& host, uint16_t port) {
  // Its own client: the main thread's may sit in a blocking get (ShareWithRanks) for as long as the timeout.
  c10d::TCPStoreOptions options;
  options.port = port;
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = timeout_;
  auto store = c10::make_intrusive<c10d::PrefixStore>("diloco", c10::make_intrusive<c10d::TCPStore>(host, options));
  const absl::Duration period = absl::FromChrono(longest_silence_) / 10;
  heartbeat_ = std::thread([this, store, period, key = CommandKey("polls", rank_)] {
    try {
      do {
        store->add(key, 1);
      } while (!stop_heartbeat_.WaitForNotificationWithTimeout(period));
    } catch (const std::exception&) {
      // The store's host (the leader) is gone: the main thread finds out at its next store call or collective.
    }
  });
}

absl::StatusOr<std::unique_ptr<WorkerCluster>> WorkerCluster::Connect(int rank, int size,
                                                                      const std::string& store_address,
                                                                      double timeout_s, const std::string& bind_host,
                                                                      torch::Device device,
                                                                      milliseconds longest_silence) {
  const size_t colon = store_address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--cluster-store: expected HOST:PORT, got '", store_address, "'"));
  }
  const std::string host = store_address.substr(0, colon);
  int port = 0;
  try {
    port = std::stoi(store_address.substr(colon + 1));
  } catch (const std::exception&) {
    port = -1;
  }
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--cluster-store: bad port in '", store_address, "'"));
  }
  const auto timeout = milliseconds(static_cast<int64_t>(timeout_s * 1000));
  std::unique_ptr<WorkerCluster> cluster(new WorkerCluster(rank, size, timeout, longest_silence));
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(port);
    options.isServer = rank == 0;
    options.numWorkers = size;
    options.waitWorkers = true;
    options.timeout = timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
    cluster->commands_ = c10::make_intrusive<c10d::PrefixStore>("diloco", store);
    cluster->group_ = device.is_cuda()
                          ? MakeNcclGroup(store, rank, size, timeout, device)
                          : MakeGlooGroup(store, rank, size, timeout, bind_host.empty() ? host : bind_host);
    if (rank > 0) cluster->StartHeartbeat(host, options.port);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cluster rendezvous at ", store_address, " (rank ", rank, " of ", size, ") failed: ", e.what()));
  }
  return cluster;
}

bool WorkerCluster::AverageGradients(const torch::Tensor& flat_gradients, bool want_stop) {
  torch::NoGradGuard no_grad;
  if (flat_gradients.device() != group_->device()) {
    throw std::invalid_argument(absl::StrCat("cluster all-reduce: gradients on ", flat_gradients.device().str(),
                                             ", the cluster's collectives on ", group_->device().str()));
  }
  if (!stop_flag_.defined()) stop_flag_ = torch::empty({1}, flat_gradients.options());
  stop_flag_.fill_(want_stop ? 1.0 : 0.0);
  std::vector<torch::Tensor> buffers = {flat_gradients, stop_flag_};
  Timed([&] { group_->AllReduceSum(buffers); });
  flat_gradients.div_(static_cast<double>(size_));
  // The one host sync of a cluster's step: every rank must agree, at this step, whether the cluster stops.
  return stop_flag_.item<float>() > 0;
}

void WorkerCluster::Broadcast(std::vector<torch::Tensor>& tensors) {
  // Every rank must issue the same broadcasts in the same order, so each tensor's path is decided by its element
  // count alone (the ranks' tensors have the same shapes, not always the same device, dtype or layout: rank 0 may pass
  // CPU tensors). A tensor of at least kStagingElements travels alone, after the packed ones before it: in place when
  // it is contiguous float32 on the group's device, else through a temporary there. The smaller ones travel packed
  // in a staging buffer of kStagingElements (no whole-model temporary).
  const auto options = torch::TensorOptions(torch::kFloat).device(group_->device());
  torch::Tensor staging;
  std::vector<torch::Tensor*> packed;  // the tensors in staging, in order
  int64_t used = 0;
  auto flush = [&] {
    if (packed.empty()) return;
    torch::Tensor flat = staging.narrow(0, 0, used);
    int64_t offset = 0;
    if (rank_ == 0) {
      for (torch::Tensor* t : packed) {
        flat.narrow(0, offset, t->numel()).copy_(t->reshape({-1}));
        offset += t->numel();
      }
    }
    group_->Broadcast(flat);
    offset = 0;
    for (torch::Tensor* t : packed) {
      if (rank_ != 0) t->copy_(flat.narrow(0, offset, t->numel()).view_as(*t));
      offset += t->numel();
    }
    packed.clear();
    used = 0;
  };
  for (torch::Tensor& t : tensors) {
    if (t.numel() >= kStagingElements) {
      flush();
      if (t.is_contiguous() && t.device() == group_->device() && t.scalar_type() == torch::kFloat) {
        group_->Broadcast(t);
      } else {
        torch::Tensor alone = rank_ == 0 ? t.to(options).contiguous() : torch::empty(t.sizes(), options);
        group_->Broadcast(alone);
        if (rank_ != 0) t.copy_(alone);
      }
      continue;
    }
    if (used + t.numel() > kStagingElements) flush();
    if (!staging.defined()) staging = torch::empty({kStagingElements}, options);
    packed.push_back(&t);
    used += t.numel();
  }
  flush();
}

void WorkerCluster::SendWords(const std::array<int64_t, 4>& words, bool wait_while_heard) {
  const int64_t seq = command_seq_++;
  std::vector<uint8_t> bytes(sizeof(words));
  std::memcpy(bytes.data(), words.data(), bytes.size());
  commands_->set(CommandKey("cmd", seq), bytes);
  WaitUntilTaken(seq, wait_while_heard);
  // Every rank has read it: no key of it is read again.
  commands_->deleteKey(CommandKey("cmd", seq));
  for (int r = 1; r < size_; ++r) commands_->deleteKey(AckKey(seq, r));
}

void WorkerCluster::WaitUntilTaken(int64_t seq, bool wait_while_heard) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  // A follower polls between commands and heartbeats while it works on one (building its trainer, a broadcast, a
  // part's push): one whose count stops moving while its acknowledgement is missing is dead. One whose count moves
  // is given up on after workers.cluster_timeout_s (wedged), or with `wait_while_heard` after kLongestTrainerBuild:
  // the shard command, which a follower takes once it has built its trainer (for a large model longer than that
  // timeout; a follower stuck, say, in NCCL's set-up while its heartbeat thread lives is not waited for forever).
  const auto silence = std::min(timeout_, longest_silence_);
  std::vector<bool> taken(size_, false);
  std::vector<int64_t> polls(size_, -1);               // each follower's poll count, as last read
  std::vector<Clock::time_point> heard(size_, start);  // when it last changed
  for (milliseconds poll = kFirstPoll;; Sleep(poll)) {
    const auto now = Clock::now();
    int missing = 0;
    for (int r = 1; r < size_; ++r) {
      if (!taken[r]) taken[r] = commands_->check({AckKey(seq, r)});
      if (taken[r]) continue;
      ++missing;
      const int64_t n = commands_->add(CommandKey("polls", r), 0);
      if (n != polls[r]) {
        polls[r] = n;
        heard[r] = now;
      }
      if (now - heard[r] >= silence || now - start >= (wait_while_heard ? kLongestTrainerBuild : timeout_)) {
        throw std::runtime_error(absl::StrCat(
            "rank ", r, " did not take command ", seq, " within ", std::chrono::duration<double>(now - start).count(),
            " s (its last poll or heartbeat ", std::chrono::duration<double>(now - heard[r]).count(),
            " s ago; workers.cluster_timeout_s ", timeout_.count() / 1000.0, "): dead or stuck"));
      }
    }
    if (missing == 0) return;
  }
}

std::array<int64_t, 4> WorkerCluster::ReceiveWords() {
  const int64_t seq = command_seq_++;
  const std::string key = CommandKey("cmd", seq);
  const std::string polls = CommandKey("polls", rank_);
  milliseconds poll = kFirstPoll;
  // Neither call blocks; both throw once rank 0, the store's host, is gone. `polls` tells rank 0 this rank lives.
  while (true) {
    commands_->add(polls, 1);
    if (commands_->check({key})) break;
    Sleep(poll);
  }
  const std::vector<uint8_t> bytes = commands_->get(key);
  std::array<int64_t, 4> words{};
  if (bytes.size() != sizeof(words)) {
    throw std::runtime_error(
        absl::StrCat("cluster command ", seq, " has ", bytes.size(), " bytes, not ", sizeof(words)));
  }
  std::memcpy(words.data(), bytes.data(), bytes.size());
  return words;
}

void WorkerCluster::Acknowledge() { commands_->set(AckKey(command_seq_ - 1, rank_), std::vector<uint8_t>{1}); }

void WorkerCluster::CheckReplicas(const std::vector<torch::Tensor>& params, int64_t step) {
  torch::NoGradGuard no_grad;
  // Sum and sum of squares in float64, in parameter order: equal parameters give bitwise equal checksums.
  double sum = 0, squares = 0;
  for (const torch::Tensor& p : params) {
    const torch::Tensor d = p.detach().to(torch::kCPU, torch::kDouble);
    sum += d.sum().item<double>();
    squares += d.square().sum().item<double>();
  }
  torch::Tensor mine = torch::tensor({sum, squares}, torch::kDouble);
  torch::Tensor theirs = mine.to(group_->device(), /*non_blocking=*/false, /*copy=*/true);
  group_->Broadcast(theirs);
  // Both NaN counts as alike: a step whose averaged gradients were NaN leaves every rank's parameters NaN, and the
  // worker then starts the round over (Worker::TrainingStayedFinite); one rank NaN alone still differs.
  const torch::Tensor rank0 = theirs.cpu();
  if (rank_ != 0 && !(rank0.eq(mine) | (rank0.isnan() & mine.isnan())).all().item<bool>()) {
    throw std::runtime_error(
        absl::StrCat("replica check: rank ", rank_, "'s parameters differ from rank 0's after ", "inner step ", step));
  }
  ++replica_checks_;
}

bool WorkerCluster::ReduceScatterGradients(FlatAdamW& optimizer, bool want_stop) {
  torch::NoGradGuard no_grad;
  torch::Tensor piece = optimizer.gradient_piece();
  if (optimizer.bucketed()) {
    if (!buckets_) throw std::logic_error("cluster reduce-scatter: a bucketed optimizer without GradientBuckets");
    buckets_->Flush();
  } else {
    torch::Tensor grads = optimizer.padded_gradients();
    if (grads.device() != group_->device()) {
      throw std::invalid_argument(absl::StrCat("cluster reduce-scatter: gradients on ", grads.device().str(),
                                               ", the cluster's collectives on ", group_->device().str()));
    }
    Timed([&] { group_->ReduceScatterSum(grads, piece); });
  }
  piece.div_(static_cast<double>(size_));
  optimizer.ReleaseGradients();  // gradients (ZeRO-2): only the slice is kept until the next backward
  torch::Tensor norm_and_stop =
      torch::cat({optimizer.SquaredSliceNorm(), torch::full({1}, want_stop ? 1.0 : 0.0, piece.options())});
  std::vector<torch::Tensor> buffers = {norm_and_stop};
  Timed([&] { group_->AllReduceSum(buffers); });
  squared_norm_ = norm_and_stop.narrow(0, 0, 1);
  return norm_and_stop[1].item<float>() > 0;
}

void WorkerCluster::InstallGradientBuckets(FlatAdamW& optimizer, std::vector<torch::Tensor> params,
                                           int64_t bucket_elements) {
  buckets_ = std::make_unique<GradientBuckets>(*group_, optimizer, std::move(params), bucket_elements, rank_, size_,
                                               &collective_seconds_);
}

void WorkerCluster::GatherParameters(FlatAdamW& optimizer) {
  torch::NoGradGuard no_grad;
  torch::Tensor all = optimizer.padded_parameters();
  torch::Tensor mine = optimizer.parameter_piece();
  Timed([&] { group_->AllGather(mine, all); });
}

std::vector<std::string> WorkerCluster::ShareWithRanks(const std::string& topic, const std::string& mine) {
  commands_->set(absl::StrCat(topic, "/", rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> lines;
  for (int r = 0; r < size_; ++r) {
    const std::vector<uint8_t> bytes = commands_->get(absl::StrCat(topic, "/", r));  // waits up to the timeout
    lines.emplace_back(bytes.begin(), bytes.end());
  }
  return lines;
}

void WorkerCluster::AllGather(torch::Tensor& mine, torch::Tensor& all) {
  torch::NoGradGuard no_grad;
  Timed([&] { group_->AllGather(mine, all); });
}

void WorkerCluster::Put(const std::string& key, const std::string& value) {
  commands_->set(absl::StrCat("x/", key), std::vector<uint8_t>(value.begin(), value.end()));
}

std::string WorkerCluster::Take(const std::string& key, milliseconds timeout) {
  const std::string full = absl::StrCat("x/", key);
  const auto start = std::chrono::steady_clock::now();
  milliseconds poll = kFirstPoll;
  while (!commands_->check({full})) {
    if (std::chrono::steady_clock::now() - start >= timeout) {
      throw std::runtime_error(absl::StrCat("no '", key, "' from the cluster within ", timeout.count() / 1000.0, " s"));
    }
    Sleep(poll);
  }
  const std::vector<uint8_t> bytes = commands_->get(full);
  commands_->deleteKey(full);
  return std::string(bytes.begin(), bytes.end());
}

std::string WorkerCluster::TakeFromLiving(int rank, const std::string& key) {
  using Clock = std::chrono::steady_clock;
  const std::string full = absl::StrCat("x/", key);
  const auto start = Clock::now();
  int64_t polls = -1;  // the follower's poll count, as last read, and when it last changed
  auto heard = start;
  for (milliseconds poll = kFirstPoll; !commands_->check({full}); Sleep(poll)) {
    const auto now = Clock::now();
    const int64_t n = commands_->add(CommandKey("polls", rank), 0);
    if (n != polls) {
      polls = n;
      heard = now;
    }
    if (now - heard >= longest_silence_ || now - start >= kLongestPartExchange) {
      throw std::runtime_error(absl::StrCat("no '", key, "' from rank ", rank, " within ",
                                            std::chrono::duration<double>(now - start).count(), " s (its last poll or ",
                                            "heartbeat ", std::chrono::duration<double>(now - heard).count(),
                                            " s ago): dead or stuck"));
    }
  }
  const std::vector<uint8_t> bytes = commands_->get(full);
  commands_->deleteKey(full);
  return std::string(bytes.begin(), bytes.end());
}

absl::Status WorkerCluster::CompareWithRanks(const std::string& topic, const std::string& mine,
                                             const std::function<std::string(int, const std::string&)>& differs) {
  try {
    commands_->set(absl::StrCat(topic, "/", rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const std::vector<uint8_t> bytes = commands_->get(absl::StrCat(topic, "/", r));  // waits up to the timeout
      const std::string difference = differs(r, std::string(bytes.begin(), bytes.end()));
      if (!difference.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("cluster rank ", rank_, " has ", difference,
                         ": every rank of a cluster must run the same config (workers.sharding, model, inner, comm)"));
      }
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cluster rank ", rank_, ": comparing ", topic, " failed: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status WorkerCluster::AttachTo(InnerTrainer& trainer, bool check_replicas) {
  FlatAdamW& optimizer = trainer.optimizer();
  const char* sharding = !optimizer.sharded() ? "none" : optimizer.owns_gradient_slice() ? "gradients" : "optimizer";
  std::string layout =
      absl::StrCat("workers.sharding ", sharding, " (", optimizer.flat_parameters().numel(), " parameters");
  if (optimizer.sharded()) {
    const int64_t piece = optimizer.gradient_piece().numel();
    absl::StrAppend(&layout, " in ", optimizer.padded_parameters().numel() / piece, " slices of ", piece);
  }
  if (optimizer.bucketed()) absl::StrAppend(&layout, ", gradients reduced in buckets");  // micro-batches, CPU
  absl::StrAppend(&layout, ")");
  absl::Status s = CompareWithRanks("layout", layout, [&layout](int r, const std::string& theirs) {
    return theirs == layout ? std::string() : absl::StrCat(layout, " but rank ", r, " has ", theirs);
  });
  if (!s.ok()) return s;
  // The keys that decide the collectives each step issues and their values (inner.micro_batch_size buckets or not,
  // comm.cluster_parts sends every rank its part, inner.lr): ranks that differ would hang in mismatched collectives
  // until the timeout, or drift apart in silence.
  const std::string shared = RenderClusterConfig(trainer.config());
  s = CompareWithRanks("config", shared, [&shared](int r, const std::string& theirs) {
    return ConfigDifference(shared, theirs, absl::StrCat("rank ", r));
  });
  if (!s.ok()) return s;
  if (!optimizer.sharded()) {
    trainer.set_gradient_hook([this](const torch::Tensor& flat_gradients, bool want_stop) {
      return AverageGradients(flat_gradients, want_stop);
    });
    if (check_replicas) {
      trainer.set_step_hook(
          [this](const std::vector<torch::Tensor>& params, int64_t step) { CheckReplicas(params, step); });
    }
    return absl::OkStatus();
  }
  if (optimizer.bucketed()) InstallGradientBuckets(optimizer, trainer.model()->parameters(), kBucketElements);
  trainer.set_gradient_hook([this, &optimizer](const torch::Tensor&, bool want_stop) {
    return ReduceScatterGradients(optimizer, want_stop);
  });
  trainer.set_norm_hook([this] { return squared_norm_; });
  trainer.set_step_hook([this, &optimizer, check_replicas](const std::vector<torch::Tensor>& params, int64_t step) {
    GatherParameters(optimizer);
    if (check_replicas) CheckReplicas(params, step);
  });
  return absl::OkStatus();
}

}  // namespace diloco
