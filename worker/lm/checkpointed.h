// Activation checkpointing (model.activation_checkpointing) for one transformer block: LibTorch C++ has no
// torch.utils.checkpoint, so this is the small piece every architecture uses instead. CheckpointedBlock(block,
// forward, x) returns forward(x) as one autograd op that keeps only its input x (and references to the block's
// parameters) for backward, not the block's activations; backward re-runs forward on a detached copy of x with grad
// enabled, under the autocast state (CPU and CUDA: enabled and dtype) captured when the forward ran, and returns the
// gradients of x and of every parameter of `block` to autograd, which accumulates them into the parameters' existing
// .grad in place (as for any op: FlatAdamW's flat gradient views stay views). Peak memory during backward is then the
// block inputs of all layers plus one block's activations, for about one more block forward per step.
//
// Requirements on `forward`: a deterministic function of x and of block's parameters only. Tensors it captures (e.g.
// llama's rotary tables) must not require grad: they get no gradient through this op. No RNG state is saved or
// replayed: none of our architectures has dropout or other randomness in a block (add it before giving one any).
// No double backward (create_graph is refused). The recompute runs with the autocast weight cache off, so it leaves no
// cached bf16 weights behind for the next step's forward.
//
// Use it only while training: LanguageModel::RecomputeBlocks() says when (the model is in train() mode, grad mode is
// on and the config asks for it); evaluation, generation and the KV-cache paths call their blocks directly.
// Stateless; thread-safe as far as the block's forward is (autocast and grad mode are thread-local).
#pragma once

#include <torch/torch.h>

#include <functional>

namespace diloco {

// A block's forward pass: x [B, T, d_model] -> [B, T, d_model].
using BlockForward = std::function<torch::Tensor(const torch::Tensor& x)>;

// forward(x), recomputed in backward instead of stored. `block` is the module whose parameters forward uses.
torch::Tensor CheckpointedBlock(torch::nn::Module& block, BlockForward forward, const torch::Tensor& x);

}  // namespace diloco
