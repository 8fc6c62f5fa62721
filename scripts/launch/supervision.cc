#include "scripts/launch/supervision.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace diloco {
namespace {

SupervisionDecision Wait(std::string reason) { return {SupervisionAction::kWait, absl::OkStatus(), std::move(reason)}; }
SupervisionDecision End(std::string reason) { return {SupervisionAction::kEnd, absl::OkStatus(), std::move(reason)}; }
SupervisionDecision Stop(absl::Status status, std::string reason) {
  return {SupervisionAction::kStop, std::move(status), std::move(reason)};
}

// "code 2", "code 137 (signal 9)".
std::string CodeText(int code) {
  if (code > 128 && code <= 128 + 64) return absl::StrCat("code ", code, " (signal ", code - 128, ")");
  return absl::StrCat("code ", code);
}

// The worker that exited first with `code` (a configuration error, a refusal), or nullptr.
const ChildView* FirstExitedWith(const std::vector<ChildView>& workers, int code) {
  const ChildView* first = nullptr;
  for (const ChildView& w : workers) {
    if (!w.running && w.exit_code == code && (first == nullptr || w.exited_at < first->exited_at)) first = &w;
  }
  return first;
}

// The worker a process belongs to: "worker-1" for "worker-1" and for its cluster's ranks "worker-1.0", "worker-1.1".
std::string WorkerOf(const std::string& name) { return name.substr(0, name.find('.')); }

// Workers (not processes: a cluster's ranks are one) with a process still running.
int RunningWorkers(const std::vector<ChildView>& workers) {
  std::set<std::string> running;
  for (const ChildView& w : workers) {
    if (w.running) running.insert(WorkerOf(w.name));
  }
  return static_cast<int>(running.size());
}

// "worker-0: code 137 (signal 9), worker-1: code 0".
std::string ExitsText(const std::vector<ChildView>& workers) {
  return absl::StrJoin(workers, ", ", [](std::string* out, const ChildView& w) {
    absl::StrAppend(out, w.name, ": ", CodeText(w.exit_code));
  });
}

// The coordinator has exited: the run is over once the workers have left too.
SupervisionDecision AfterCoordinator(const SupervisionView& view, size_t running, double now,
                                     const SupervisionOptions& options) {
  const std::string coordinator = absl::StrCat("the coordinator exited (", CodeText(view.coordinator.exit_code), ")");
  if (running == 0) return End(absl::StrCat(coordinator, " and every worker has exited"));
  if (now - view.coordinator.exited_at >= options.worker_grace_s) {
    return End(absl::StrCat(coordinator, " ", options.worker_grace_s, " s ago; stopping the ", running,
                            " worker process(es) still running"));
  }
  return Wait(absl::StrCat(coordinator, "; waiting up to ", options.worker_grace_s, " s for ", running,
                           " worker process(es) to leave"));
}

// Every worker has exited while the coordinator runs.
SupervisionDecision NoWorkersLeft(const SupervisionView& view, double now, const SupervisionOptions& options) {
  const bool failed =
      std::any_of(view.workers.begin(), view.workers.end(), [](const ChildView& w) { return w.exit_code != 0; });
  double last_exit = 0;
  for (const ChildView& w : view.workers) last_exit = std::max(last_exit, w.exited_at);
  const std::string exits = ExitsText(view.workers);
  if (failed) {
    return Stop(absl::UnavailableError(absl::StrCat("every worker has exited (", exits,
                                                    ") and the run has rounds left; the coordinator was stopped")),
                absl::StrCat("every worker has exited (", exits, ") with rounds left: stopping the coordinator"));
  }
  if (now - last_exit >= options.completion_grace_s) {
    return Stop(absl::UnavailableError(absl::StrCat("every worker has exited (", exits,
                                                    ": drained or stopped) and the "
                                                    "coordinator did not complete the run within ",
                                                    options.completion_grace_s,
                                                    " s; rounds are left and the coordinator was "
                                                    "stopped (its last checkpoint stays on disk)")),
                absl::StrCat("every worker has exited and the run is not complete: stopping the coordinator"));
  }
  return Wait(absl::StrCat("every worker has exited (", exits, "); waiting up to ", options.completion_grace_s,
                           " s for the coordinator to complete the run"));
}

}  // namespace

SupervisionDecision DecideSupervision(const SupervisionView& view, double now, const SupervisionOptions& options) {
  if (view.signal != 0) {
    return Stop(absl::CancelledError(absl::StrCat("signal ", view.signal)),
                absl::StrCat("signal ", view.signal, ": stopping workers and coordinator"));
  }
  if (const ChildView* w = FirstExitedWith(view.workers, kWorkerConfigErrorExit)) {
    const std::string line = w->error_line.empty()
                                 ? "exited with code 2 (a configuration error; its output above says which)"
                                 : w->error_line;
    return Stop(absl::InvalidArgumentError(absl::StrCat(w->name, ": ", line)),
                absl::StrCat(w->name, " exited with a configuration error: stopping workers and coordinator"));
  }
  const size_t running =
      std::count_if(view.workers.begin(), view.workers.end(), [](const ChildView& w) { return w.running; });
  if (!view.coordinator.running) return AfterCoordinator(view, running, now, options);
  // Not once another worker exited 0 after the refusal: the run completed (the workers leave before the coordinator
  // exits) or one was drained since. (The refused worker's own cluster ranks exit 0 after it; a drain before it does
  // not make up for it.)
  const ChildView* w = FirstExitedWith(view.workers, kWorkerRefusedExit);
  const bool left_cleanly_since =
      w != nullptr && std::any_of(view.workers.begin(), view.workers.end(), [&](const ChildView& c) {
        return !c.running && c.exit_code == 0 && c.exited_at >= w->exited_at && WorkerOf(c.name) != WorkerOf(w->name);
      });
  if (w != nullptr && !left_cleanly_since && RunningWorkers(view.workers) < options.min_workers) {
    const std::string line = w->error_line.empty() ? "exited with code 3 (refused by the coordinator)" : w->error_line;
    return Stop(absl::InvalidArgumentError(absl::StrCat(
                    w->name, ": ", line, " (", RunningWorkers(view.workers), " worker(s) still running, fewer than ",
                    "coordinator.min_workers ", options.min_workers, ": no round could close)")),
                absl::StrCat(w->name,
                             " was refused by the coordinator and no round can close without it: stopping "
                             "workers and coordinator"));
  }
  if (view.workers.empty() || running > 0) {
    std::vector<ChildView> left;
    for (const ChildView& w : view.workers) {
      if (!w.running) left.push_back(w);
    }
    return Wait(absl::StrCat(running, " of ", view.workers.size(), " worker process(es) running",
                             left.empty() ? "" : absl::StrCat("; left: ", ExitsText(left))));
  }
  return NoWorkersLeft(view, now, options);
}

int ExitCodeOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 0;
    case absl::StatusCode::kCancelled:
      return 130;
    case absl::StatusCode::kUnavailable:
      return 3;
    case absl::StatusCode::kAborted:
      return 1;
    default:
      return 2;
  }
}

std::string ErrorMessageOf(const std::string& line) {
  absl::string_view rest = line;
  if (absl::ConsumePrefix(&rest, "diloco-worker: ")) {
    absl::ConsumePrefix(&rest, "error: ");
    return std::string(rest);
  }
  // spdlog's "%H:%M:%S.%e %l NAME: %v": a time, a level, the process's name, the message.
  const size_t space = rest.find(' ');
  if (space == absl::string_view::npos || space < 8 || rest[2] != ':' ||
      !std::isdigit(static_cast<unsigned char>(rest[0]))) {
    return "";
  }
  rest.remove_prefix(space + 1);
  if (!absl::ConsumePrefix(&rest, "error ") && !absl::ConsumePrefix(&rest, "critical ")) return "";
  const size_t colon = rest.find(": ");
  if (colon == absl::string_view::npos || rest.substr(0, colon).find(' ') != absl::string_view::npos) {
    return std::string(rest);
  }
  return std::string(rest.substr(colon + 2));
}

}  // namespace diloco
