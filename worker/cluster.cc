#include "worker/cluster.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "worker/collective_group.h"
#include "worker/trainer.h"

namespace diloco {

WorkerCluster::WorkerCluster(int rank, int size) : rank_(rank), size_(size) {}
WorkerCluster::~WorkerCluster() = default;

absl::StatusOr<std::unique_ptr<WorkerCluster>> WorkerCluster::Connect(int rank, int size,
                                                                      const std::string& store_address,
                                                                      double timeout_s, const std::string& bind_host,
                                                                      torch::Device device) {
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
  std::unique_ptr<WorkerCluster> cluster(new WorkerCluster(rank, size));
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(port);
    options.isServer = rank == 0;
    options.numWorkers = size;
    options.waitWorkers = true;
    options.timeout = timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
    cluster->group_ = device.is_cuda()
                          ? MakeNcclGroup(store, rank, size, timeout, device)
                          : MakeGlooGroup(store, rank, size, timeout, bind_host.empty() ? host : bind_host);
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
  const auto t0 = std::chrono::steady_clock::now();
  group_->AllReduceSum(buffers);
  collective_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  flat_gradients.div_(static_cast<double>(size_));
  // The one host sync of a cluster's step: every rank must agree, at this step, whether the cluster stops.
  return stop_flag_.item<float>() > 0;
}

void WorkerCluster::Broadcast(std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (const torch::Tensor& t : tensors) n += t.numel();
  torch::Tensor flat = torch::empty({n}, torch::TensorOptions(torch::kFloat).device(group_->device()));
  int64_t offset = 0;
  if (rank_ == 0) {
    for (const torch::Tensor& t : tensors) {
      flat.narrow(0, offset, t.numel()).copy_(t.reshape({-1}));
      offset += t.numel();
    }
  }
  group_->Broadcast(flat);
  if (rank_ != 0) {
    for (torch::Tensor& t : tensors) {
      t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  }
}

void WorkerCluster::BroadcastWords(std::array<int64_t, 4>& words) {
  torch::Tensor buffer = torch::tensor({words[0], words[1], words[2], words[3]}, torch::kLong).to(group_->device());
  group_->Broadcast(buffer);
  buffer = buffer.cpu();
  const int64_t* v = buffer.data_ptr<int64_t>();
  std::copy(v, v + words.size(), words.begin());
}

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
  if (rank_ != 0 && !theirs.cpu().equal(mine)) {
    throw std::runtime_error(
        absl::StrCat("replica check: rank ", rank_, "'s parameters differ from rank 0's after ", "inner step ", step));
  }
  ++replica_checks_;
}

void WorkerCluster::AttachTo(InnerTrainer& trainer, bool check_replicas) {
  trainer.set_gradient_hook([this](const torch::Tensor& flat_gradients, bool want_stop) {
    return AverageGradients(flat_gradients, want_stop);
  });
  if (check_replicas) {
    trainer.set_step_hook(
        [this](const std::vector<torch::Tensor>& params, int64_t step) { CheckReplicas(params, step); });
  }
}

}  // namespace diloco
