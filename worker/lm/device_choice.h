// DeviceChoice: which torch device a worker process (or a rank of a worker cluster) trains on, from workers.device,
// or the coordinator evaluates on, from coordinator.device; with the process's local rank and an optional
// per-process override (--device), checked against what this LibTorch and this machine have. Pure: the CUDA facts
// come in as arguments (CudaFacts), so every row is unit-tested without a GPU. `cuda` gives the rank of local index r
// the device cuda:r (one GPU per rank, as torchrun's LOCAL_RANK); `cuda:N` pins every rank to N, which a cluster of
// several ranks on one machine does by accident: the choice says so. Stateless; thread-safe.
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
  std::string warning;  // "" or one line to log (ranks of a cluster sharing one GPU)
};

// `key` names where spec came from in errors ("workers.device" or "--device"). local_rank >= 0; cluster_size >= 1.
absl::StatusOr<DeviceChoice> ChooseDevice(const std::string& spec, const std::string& key, int local_rank,
                                          int cluster_size, const CudaFacts& cuda);

// The syntax alone (cpu, cuda, cuda:N): for config validation, where the machine is not known yet.
absl::Status CheckDeviceSyntax(const std::string& spec, const std::string& key);

}  // namespace diloco
