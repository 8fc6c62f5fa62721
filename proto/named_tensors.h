// NamedTensors: tensors by name, in the model's parameter order: the plain-tensor form of theta, of a pseudo-gradient
// and of a model's parameters that every layer hands around (the wire's chunker and assembler, checkpoints, the
// coordinator core, the trainer, the models' weight I/O). A plain alias; the tensors' owners say who may touch them.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace diloco {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

}  // namespace diloco
