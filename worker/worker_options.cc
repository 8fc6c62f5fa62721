#include "worker/worker_options.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"

namespace diloco {
namespace {

constexpr char kExitCodeUrl[] = "diloco.worker/exit_code";

absl::StatusCode CodeFor(WorkerExit exit) {
  switch (exit) {
    case kWorkerDone:
      return absl::StatusCode::kOk;
    case kWorkerFailed:
      return absl::StatusCode::kInternal;
    case kWorkerConfigError:
      return absl::StatusCode::kInvalidArgument;
    case kWorkerRefused:
      return absl::StatusCode::kFailedPrecondition;
    case kWorkerUnreachable:
      return absl::StatusCode::kUnavailable;
    case kWorkerClusterFailed:
      return absl::StatusCode::kAborted;
    case kWorkerInterrupted:
      return absl::StatusCode::kCancelled;
  }
  return absl::StatusCode::kUnknown;
}

}  // namespace

absl::Status WorkerError(WorkerExit code, const std::string& message) {
  return WithExitCode(absl::Status(CodeFor(code), message), code);
}

absl::Status WithExitCode(absl::Status status, WorkerExit code) {
  if (!status.ok()) status.SetPayload(kExitCodeUrl, absl::Cord(std::to_string(static_cast<int>(code))));
  return status;
}

WorkerExit ExitCodeOf(const absl::Status& status) {
  if (status.ok()) return kWorkerDone;
  const auto payload = status.GetPayload(kExitCodeUrl);  // an absl::optional<absl::Cord>
  int code = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &code)) return kWorkerConfigError;
  return static_cast<WorkerExit>(code);
}

}  // namespace diloco
