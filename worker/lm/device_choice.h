// DeviceChoice: which torch device a worker process (or a rank of a worker cluster) trains on, from workers.device,
// or the coordinator evaluates on, from coordinator.device; with the process's local rank and an optional
// per-process override (--device), checked against what this LibTorch and this machine have. Pure: the CUDA facts
// come in as arguments (CudaFacts), so every row is unit-tested without a GPU. `cuda` gives the process of local
// rank r (its index among the worker processes on this machine: diloco-launch's worker index, torchrun's LOCAL_RANK)
// the device cuda:(r mod devices): one GPU per process while there are enough, then round robin (said in a warning).
// A rank of a cluster larger than the machine's GPU count gets no wrap (NCCL refuses two ranks of one group on one
// GPU): an error, as a local rank of a cluster is its rank when nothing else is known. `cuda:N` pins the process to N,
// which a cluster of several ranks on one machine does by accident: the choice says so. Stateless; thread-safe.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace diloco {

struct CudaFacts {
  bool built = false;  // this LibTorch has CUDA
  int devices = 0;     // CUDA devices this process sees
};

struct DeviceChoice {
  std::string device;   // "cpu" or "cuda:N": what torch::Device gets
  std::string warning;  // "" or one line to log (processes sharing one GPU)
  // How it was chosen, for the start-up line: "cuda:1 (workers.device 'cuda': local rank 5 on a machine with 4 GPUs)".
  std::string why;
};

// `key` names where spec came from in errors ("workers.device" or "--device"). local_rank >= 0; cluster_size >= 1
// (the ranks of this process's collective group: workers.cluster_size, or all ranks of --mode ddp).
absl::StatusOr<DeviceChoice> ChooseDevice(const std::string& spec, const std::string& key, int local_rank,
                                          int cluster_size, const CudaFacts& cuda);

// The syntax alone (cpu, cuda, cuda:N): for config validation, where the machine is not known yet.
absl::Status CheckDeviceSyntax(const std::string& spec, const std::string& key);

}  // namespace diloco
