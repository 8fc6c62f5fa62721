// CollectiveGroup over c10d's ProcessGroupNCCL (CUDA builds of LibTorch 2.x only; worker/collective_group.h). The
// group's communicator is bound to the rank's device up front, so the first collective does not pick cuda:0.
#include <c10/cuda/CUDAGuard.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "worker/collective_group.h"

namespace diloco {
namespace {

class NcclGroup : public CollectiveGroup {
 public:
  NcclGroup(c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg, torch::Device device)
      : pg_(std::move(pg)), device_(device) {}
  torch::Device device() const override { return device_; }
  void AllReduceSum(std::vector<torch::Tensor>& tensors) override {
    c10::cuda::CUDAGuard guard(device_);
    if (tensors.size() == 1) {
      pg_->allreduce(tensors)->wait();
    } else {
      pg_->allreduce_coalesced(tensors)->wait();
    }
  }
  void Broadcast(torch::Tensor& tensor) override {
    c10::cuda::CUDAGuard guard(device_);
    std::vector<at::Tensor> buffers = {tensor};
    pg_->broadcast(buffers)->wait();
  }
  // ncclReduceScatter / ncclAllGather on the flat buffers (LibTorch 2.x: _reduce_scatter_base and _allgather_base, kept
  // as aliases of reduce_scatter_single and all_gather_single where those are the new names). NCCL works in place
  // when the piece is the rank's own piece of the full buffer.
  void ReduceScatterSum(torch::Tensor& input, torch::Tensor& output) override {
    c10::cuda::CUDAGuard guard(device_);
    pg_->_reduce_scatter_base(output, input)->wait();
  }
  void AllGather(torch::Tensor& input, torch::Tensor& output) override {
    c10::cuda::CUDAGuard guard(device_);
    pg_->_allgather_base(output, input)->wait();
  }
  bool native_reduce_scatter() const override { return true; }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
  torch::Device device_;
};

}  // namespace

std::unique_ptr<CollectiveGroup> MakeNcclGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                               std::chrono::milliseconds timeout, const torch::Device& device) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  c10::cuda::CUDAGuard guard(device);
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  pg->setBoundDeviceId(device);
  return std::make_unique<NcclGroup>(std::move(pg), device);
}

}  // namespace diloco
