// CollectiveGroup over c10d's ProcessGroupGloo (both LibTorch builds; worker/collective_group.h).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "worker/collective_group.h"

namespace diloco {
namespace {

class GlooGroup : public CollectiveGroup {
 public:
  explicit GlooGroup(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg) : pg_(std::move(pg)) {}
  torch::Device device() const override { return torch::kCPU; }
  void AllReduceSum(std::vector<torch::Tensor>& tensors) override {
    if (tensors.size() == 1) {
      pg_->allreduce(tensors)->wait();
    } else {
      pg_->allreduce_coalesced(tensors)->wait();
    }
  }
  void Broadcast(torch::Tensor& tensor) override {
    std::vector<at::Tensor> buffers = {tensor};
    pg_->broadcast(buffers)->wait();
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

}  // namespace

std::unique_ptr<CollectiveGroup> MakeGlooGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                               std::chrono::milliseconds timeout, const std::string& bind_host) {
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(bind_host));
  options->timeout = timeout;
  return std::make_unique<GlooGroup>(c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options));
}

}  // namespace diloco
