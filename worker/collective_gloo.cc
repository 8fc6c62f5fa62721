// CollectiveGroup over c10d's ProcessGroupGloo (both LibTorch builds; worker/collective_group.h). ProcessGroupGloo
// gained reduce_scatter in pytorch/pytorch#149869 (March 2025; LibTorch 1.13 and the 2.x releases before it throw
// "ProcessGroupGloo does not support reduce_scatter" when it is called, before anything is sent): ReduceScatterSum
// tries it once, and where it throws all-reduces the whole buffer and takes this rank's piece from then on (twice
// the bytes of a reduce-scatter). Every rank runs the same LibTorch, so every rank takes the same path.
// The all-gather is in place when the input is this rank's piece of the output (n broadcasts, one from each rank:
// Gloo's allgather, the list form both have, gathers into a whole-buffer temporary of its own first; 1.13's Gloo lacks
// _allgather_base), else that list form.
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
  void ReduceScatterSum(torch::Tensor& input, torch::Tensor& output) override {
    const int64_t piece = output.numel();
    const int rank = pg_->getRank();
    if (native_reduce_scatter_) {
      std::vector<at::Tensor> pieces = input.split(piece);
      // Gloo reads the pieces while it writes the output: an output inside the input gets a buffer of its own first.
      const bool in_place = output.data_ptr() == pieces[rank].data_ptr();
      std::vector<at::Tensor> outputs = {in_place ? torch::empty_like(output) : output};
      std::vector<std::vector<at::Tensor>> inputs = {pieces};
      c10::intrusive_ptr<c10d::Work> work;
      try {
        work = pg_->reduce_scatter(outputs, inputs);
      } catch (const c10::Error& e) {
        if (std::string(e.what()).find("does not support reduce_scatter") == std::string::npos) throw;
        native_reduce_scatter_ = false;  // this LibTorch's Gloo has none (nothing was sent): the fallback below
      }
      if (work) {
        work->wait();
        if (in_place) output.copy_(outputs[0]);
        return;
      }
    }
    std::vector<at::Tensor> buffers = {input};
    pg_->allreduce(buffers)->wait();
    torch::Tensor mine = input.narrow(0, rank * piece, piece);
    if (output.data_ptr() != mine.data_ptr()) output.copy_(mine);
  }
  void AllGather(torch::Tensor& input, torch::Tensor& output) override {
    const int64_t piece = input.numel();
    const int rank = pg_->getRank();
    if (output.is_contiguous() && input.data_ptr() == output.narrow(0, rank * piece, piece).data_ptr()) {
      // In place: one broadcast of each rank's piece from that rank, straight into `output` (Gloo's allgather would
      // gather into a flat buffer of its own, n * S more, and copy out of it).
      for (int root = 0; root < pg_->getSize(); ++root) {
        std::vector<at::Tensor> buffers = {output.narrow(0, root * piece, piece)};
        c10d::BroadcastOptions options;
        options.rootRank = root;
        pg_->broadcast(buffers, options)->wait();
      }
      return;
    }
    std::vector<std::vector<at::Tensor>> outputs = {output.split(piece)};
    std::vector<at::Tensor> inputs = {input};
    pg_->allgather(outputs, inputs)->wait();
  }
  void ReduceSum(torch::Tensor& tensor, int root) override {
    std::vector<at::Tensor> buffers = {tensor};
    c10d::ReduceOptions options;
    options.rootRank = root;
    pg_->reduce(buffers, options)->wait();
  }
  bool native_reduce_scatter() const override { return native_reduce_scatter_; }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  bool native_reduce_scatter_ = true;  // until this LibTorch's Gloo says it has none
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
