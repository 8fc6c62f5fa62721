#include "worker/lm/checkpointed.h"

#include <ATen/autocast_mode.h>

#include <utility>
#include <vector>

#include "worker/lm/torch_compat.h"

namespace diloco {
namespace {

// The thread-local autocast state a block's forward ran under (CPU and CUDA), to run its recompute under the same.
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;
};

AutocastState CurrentAutocast() {
  return {torch_compat::AutocastEnabled(at::kCPU), torch_compat::AutocastEnabled(at::kCUDA),
          torch_compat::AutocastDtype(at::kCPU), torch_compat::AutocastDtype(at::kCUDA)};
}

void SetAutocast(const AutocastState& s) {
  torch_compat::SetAutocast(at::kCPU, s.cpu, s.cpu_dtype);
  torch_compat::SetAutocast(at::kCUDA, s.cuda, s.cuda_dtype);
}

// Runs its scope under `state` with the autocast weight cache off; restores the thread's previous state on exit.
// (Autocast caches the casts of leaf weights an op takes directly, e.g. gpt2's Conv1D addmm: copies made here would
// outlive the scope and be used, stale, by the next step's forward after the optimizer changed the weights in place.)
class AutocastAs {
 public:
  explicit AutocastAs(const AutocastState& state)
      : was_(CurrentAutocast()), cache_was_(at::autocast::is_autocast_cache_enabled()) {
    SetAutocast(state);
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~AutocastAs() {
    at::autocast::set_autocast_cache_enabled(cache_was_);
    SetAutocast(was_);
  }
  AutocastAs(const AutocastAs&) = delete;
  AutocastAs& operator=(const AutocastAs&) = delete;

 private:
  AutocastState was_;
  bool cache_was_;
};

// What backward needs besides the saved tensors: the block's forward and the autocast state it ran under. Held by
// the autograd node (as an IValue capsule) until the node is freed.
struct Recompute : torch::CustomClassHolder {
  BlockForward forward;
  AutocastState autocast;
};

// Inputs: x, then the block's parameters (so that autograd routes their gradients to their AccumulateGrad nodes, which
// add them into .grad in place), then the recompute capsule (not a tensor).
class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, at::TensorList params,
                               const c10::intrusive_ptr<Recompute>& recompute) {
    torch::NoGradGuard no_grad;  // Function::apply runs forward without grad already; this op keeps no graph
    torch::autograd::variable_list saved{x};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);  // parameters are leaves: saved by reference, with their version for the check
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(recompute);
    return recompute->forward(x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    TORCH_CHECK(!torch::GradMode::is_enabled(), "CheckpointedBlock: no double backward (create_graph)");
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const auto capsule = ctx->saved_data["recompute"].toCapsule();
    const Recompute& recompute = *static_cast<Recompute*>(capsule.get());
    const torch::Tensor x = saved[0].detach().requires_grad_(saved[0].requires_grad());
    std::vector<size_t> slots;  // which of the op's inputs get a gradient
    torch::autograd::variable_list wrt;
    for (size_t i = 0; i < saved.size(); ++i) {
      const torch::Tensor& t = i == 0 ? x : saved[i];
      if (t.requires_grad()) {
        slots.push_back(i);
        wrt.push_back(t);
      }
    }
    torch::Tensor y;
    {
      torch::AutoGradMode grad_mode(true);
      AutocastAs autocast(recompute.autocast);
      y = recompute.forward(x);
    }
    torch::autograd::variable_list grads(saved.size() + 1);  // x, the parameters, the capsule (none)
    if (wrt.empty() || !y.requires_grad()) return grads;
    const torch::autograd::variable_list got =
        torch::autograd::grad({y}, wrt, {grad_outputs[0]}, /*retain_graph=*/false, /*create_graph=*/false,
                              /*allow_unused=*/true);
    for (size_t j = 0; j < slots.size(); ++j) grads[slots[j]] = got[j];
    return grads;
  }
};

}  // namespace

torch::Tensor CheckpointedBlock(torch::nn::Module& block, BlockForward forward, const torch::Tensor& x) {
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->forward = std::move(forward);
  recompute->autocast = CurrentAutocast();
  const std::vector<torch::Tensor> params = block.parameters();
  return CheckpointFunction::apply(x, at::TensorList(params), recompute);
}

}  // namespace diloco
