#include "worker/lm/device_choice.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace diloco {
namespace {

// -1: plain "cuda"; N >= 0: "cuda:N"; -2: not a CUDA spec.
int CudaIndex(const std::string& spec) {
  if (spec == "cuda") return -1;
  absl::string_view rest = spec;
  int n = 0;
  if (absl::ConsumePrefix(&rest, "cuda:") && !rest.empty() && absl::SimpleAtoi(rest, &n) && n >= 0) return n;
  return -2;
}

std::string Available(const CudaFacts& cuda) {
  if (!cuda.built) {
    return "this build's LibTorch has no CUDA (Debian's CPU LibTorch; see docs/operations.md, Two LibTorch builds)";
  }
  if (cuda.devices == 0) return "this machine shows no CUDA device";
  return absl::StrCat("this machine has ", cuda.devices, " CUDA device", cuda.devices == 1 ? "" : "s", " (cuda:0",
                      cuda.devices > 1 ? absl::StrCat("..cuda:", cuda.devices - 1) : "", ")");
}

}  // namespace

absl::Status CheckDeviceSyntax(const std::string& spec, const std::string& key) {
  if (spec == "cpu" || CudaIndex(spec) != -2) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key, ": '", spec, "' is not a device; use cpu, cuda or cuda:N"));
}

absl::StatusOr<DeviceChoice> ChooseDevice(const std::string& spec, const std::string& key, int local_rank,
                                          int cluster_size, const CudaFacts& cuda) {
  if (absl::Status s = CheckDeviceSyntax(spec, key); !s.ok()) return s;
  if (spec == "cpu") return DeviceChoice{"cpu", "", absl::StrCat("cpu (", key, ")")};
  const int pinned = CudaIndex(spec);
  // A cluster's ranks need a GPU each: no wrap when the cluster is larger than the machine's GPU count.
  const bool wraps = cuda.devices > 0 && cluster_size <= cuda.devices;
  const int index = pinned >= 0 ? pinned : (wraps ? local_rank % cuda.devices : local_rank);
  if (!cuda.built || cuda.devices == 0 || index >= cuda.devices) {
    const std::string what = pinned >= 0 ? absl::StrCat("'", spec, "'")
                                         : absl::StrCat("'cuda' (cuda:", index, " for local rank ", local_rank, ")");
    const std::string cluster = cuda.devices > 0 && pinned < 0 && cluster_size > cuda.devices
                                    ? absl::StrCat(", fewer than the ", cluster_size, " ranks of this cluster")
                                    : "";
    return absl::FailedPreconditionError(
        absl::StrCat(key, ": ", what, " requested but ", Available(cuda), cluster, "; available: cpu"));
  }
  DeviceChoice choice{absl::StrCat("cuda:", index), "", ""};
  if (pinned >= 0) {
    choice.why = absl::StrCat(choice.device, " (", key, " '", spec, "')");
  } else {
    choice.why = absl::StrCat(choice.device, " (", key, " 'cuda': local rank ", local_rank, " on a machine with ",
                              cuda.devices, " GPU", cuda.devices == 1 ? "" : "s", ")");
  }
  if (pinned >= 0 && cluster_size > 1) {
    choice.warning = absl::StrCat(key, ": '", spec, "' puts every rank of this ", cluster_size,
                                  "-rank cluster that shares this machine on one GPU; use 'cuda' (rank r gets "
                                  "cuda:<local rank>) or give each rank --device");
  } else if (pinned < 0 && local_rank >= cuda.devices) {
    choice.warning =
        absl::StrCat(key, ": local rank ", local_rank, " shares ", choice.device, " with local rank ", index,
                     ": this machine has ", cuda.devices, " GPU", cuda.devices == 1 ? "" : "s", " for more processes");
  }
  return choice;
}

}  // namespace diloco
