#include "worker/cluster.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "worker/trainer.h"

namespace diloco {

struct WorkerCluster::Group {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
};

WorkerCluster::WorkerCluster(int rank, int size) : rank_(rank), size_(size) {}
WorkerCluster::~WorkerCluster() = default;

absl::StatusOr<std::unique_ptr<WorkerCluster>> WorkerCluster::Connect(int rank, int size,
                                                                      const std::string& store_address,
                                                                      double timeout_s, const std::string& bind_host) {
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
    auto gloo = c10d::ProcessGroupGloo::Options::create();
    gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(bind_host.empty() ? host : bind_host));
    gloo->timeout = timeout;
    cluster->group_ = std::make_unique<Group>();
    cluster->group_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cluster rendezvous at ", store_address, " (rank ", rank, " of ", size, ") failed: ", e.what()));
  }
  return cluster;
}

bool WorkerCluster::AverageGradients(const std::vector<torch::Tensor>& params, bool want_stop) {
  torch::NoGradGuard no_grad;
  int64_t n = 1;  // element 0: the stop wishes
  for (const torch::Tensor& p : params) n += p.numel();
  if (!flat_.defined() || flat_.numel() != n) flat_ = torch::empty({n}, torch::kFloat);
  flat_[0] = want_stop ? 1.0f : 0.0f;
  int64_t offset = 1;
  for (const torch::Tensor& p : params) {
    torch::Tensor slice = flat_.narrow(0, offset, p.numel());
    if (p.grad().defined()) {
      slice.copy_(p.grad().reshape({-1}));
    } else {
      slice.zero_();
    }
    offset += p.numel();
  }
  std::vector<at::Tensor> buffers = {flat_};
  const auto t0 = std::chrono::steady_clock::now();
  group_->pg->allreduce(buffers)->wait();
  collective_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool stop = flat_[0].item<float>() > 0;
  flat_.narrow(0, 1, n - 1).div_(static_cast<double>(size_));
  offset = 1;
  for (const torch::Tensor& p : params) {
    if (p.grad().defined()) p.mutable_grad().copy_(flat_.narrow(0, offset, p.numel()).view_as(p.grad()));
    offset += p.numel();
  }
  return stop;
}

void WorkerCluster::Broadcast(std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (const torch::Tensor& t : tensors) n += t.numel();
  torch::Tensor flat = torch::empty({n}, torch::kFloat);
  int64_t offset = 0;
  if (rank_ == 0) {
    for (const torch::Tensor& t : tensors) {
      flat.narrow(0, offset, t.numel()).copy_(t.reshape({-1}));
      offset += t.numel();
    }
  }
  std::vector<at::Tensor> buffers = {flat};
  group_->pg->broadcast(buffers)->wait();
  if (rank_ != 0) {
    for (torch::Tensor& t : tensors) {
      t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  }
}

void WorkerCluster::BroadcastWords(std::array<int64_t, 4>& words) {
  std::vector<at::Tensor> buffers = {torch::tensor({words[0], words[1], words[2], words[3]}, torch::kLong)};
  group_->pg->broadcast(buffers)->wait();
  const int64_t* v = buffers[0].data_ptr<int64_t>();
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
  std::vector<at::Tensor> buffers = {mine.clone()};
  group_->pg->broadcast(buffers)->wait();
  if (rank_ != 0 && !buffers[0].equal(mine)) {
    throw std::runtime_error(
        absl::StrCat("replica check: rank ", rank_, "'s parameters differ from rank 0's after ", "inner step ", step));
  }
  ++replica_checks_;
}

void WorkerCluster::AttachTo(InnerTrainer& trainer, bool check_replicas) {
  trainer.set_gradient_hook(
      [this](const std::vector<torch::Tensor>& params, bool want_stop) { return AverageGradients(params, want_stop); });
  if (check_replicas) {
    trainer.set_step_hook(
        [this](const std::vector<torch::Tensor>& params, int64_t step) { CheckReplicas(params, step); });
  }
}

}  // namespace diloco
