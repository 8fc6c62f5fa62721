#include "coordinator/metrics_text.h"

#include <charconv>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "proto/round_phase.h"

namespace diloco {
namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Appends metric families to one string: HELP/TYPE once per family, then its samples.
class Exposition {
 public:
  void Family(const std::string& name, const char* type, const char* help) {
    out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void Sample(const std::string& name, const Labels& labels, const std::string& value) {
    out_ += name;
    if (!labels.empty()) {
      out_ += "{";
      for (size_t i = 0; i < labels.size(); ++i) {
        if (i > 0) out_ += ",";
        out_ += labels[i].first + "=\"" + EscapeLabelValue(labels[i].second) + "\"";
      }
      out_ += "}";
    }
    out_ += " " + value + "\n";
  }
  // A family with one unlabelled sample.
  void Single(const std::string& name, const char* type, const char* help, const std::string& value) {
    Family(name, type, help);
    Sample(name, {}, value);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string Int(int64_t v) { return std::to_string(v); }
std::string Real(double v) { return FormatSampleValue(v); }

// Counts per label value, with `always` present (as 0) even when nothing has that value, in that order first.
std::vector<std::pair<std::string, int64_t>> CountBy(const std::vector<std::string>& values,
                                                     const std::vector<std::string>& always) {
  std::vector<std::pair<std::string, int64_t>> counts;
  for (const std::string& a : always) counts.emplace_back(a, 0);
  for (const std::string& v : values) {
    auto it = counts.begin();
    while (it != counts.end() && it->first != v) ++it;
    if (it == counts.end()) {
      counts.emplace_back(v, 1);
    } else {
      ++it->second;
    }
  }
  return counts;
}

// A worker's loss and tokens/s are set by its pushes; before the first one they are not figures but defaults.
bool HasReported(const WorkerStatus& w) { return w.pushed_this_round() || w.rounds_contributed() > 0; }

void RunMetrics(const StatusReply& s, Exposition& e) {
  e.Single("diloco_round", "gauge", "Completed outer steps (rounds) t.", Int(s.round()));
  e.Single("diloco_rounds_planned", "gauge",
           "Rounds the run is configured for (outer.rounds; x comm.fragments with Streaming DiLoCo).",
           Int(s.rounds_total()));
  e.Family("diloco_phase", "gauge", "1 for the coordinator's current phase, 0 for the others.");
  for (const auto& [phase, name] : kRoundPhases) {  // a fixed set: one series per phase, whatever s.phase() says
    e.Sample("diloco_phase", {{"phase", std::string(name)}}, s.phase() == name ? "1" : "0");
  }
  e.Single("diloco_parameters", "gauge", "Parameters of the model (elements of theta).", Int(s.params()));
  std::vector<std::string> states;
  for (const WorkerStatus& w : s.workers()) states.push_back(w.state());
  e.Family("diloco_members", "gauge", "Workers known to the coordinator, by membership state.");
  for (const auto& [state, n] : CountBy(states, {"active", "lost", "left"})) {
    e.Sample("diloco_members", {{"state", state}}, Int(n));
  }
  if (s.evals_size() > 0) {
    const EvalPoint& last = s.evals(s.evals_size() - 1);
    e.Single("diloco_val_loss", "gauge", "Validation loss (nats/token) of the global model at the newest eval.",
             Real(last.val_loss()));
    e.Single("diloco_val_loss_round", "gauge", "Round of the newest validation eval.", Int(last.round()));
  }
}

void TrafficMetrics(const StatusReply& s, Exposition& e) {
  int64_t tokens = 0;
  for (const WorkerStatus& w : s.workers()) tokens += w.tokens();
  e.Single("diloco_tokens_total", "counter", "Training tokens of all workers in committed rounds.", Int(tokens));
  e.Single("diloco_bytes_received_total", "counter",
           "Pseudo-gradient chunk bytes the coordinator received (every push, committed or not).",
           Int(s.bytes_received()));
  e.Single("diloco_bytes_sent_total", "counter", "Parameter chunk bytes the coordinator sent to pulling workers.",
           Int(s.bytes_sent()));
  e.Single("diloco_bytes_pushed_committed_total", "counter",
           "Pseudo-gradient bytes pushed in rounds that were committed.", Int(s.bytes_pushed_committed()));
  e.Single("diloco_dp_equivalent_bytes_total", "counter",
           "Bytes ring all-reduce of fp32 gradients every inner step would have sent for the same committed rounds.",
           Int(s.dp_equivalent_bytes()));
  e.Single("diloco_last_round_bytes_pushed", "gauge", "Pseudo-gradient bytes pushed in the last committed round.",
           Int(s.last_round_bytes_pushed()));
  e.Single("diloco_last_outer_step_seconds", "gauge", "Seconds the last outer optimizer step took.",
           Real(s.last_outer_step_seconds()));
  e.Single("diloco_last_round_seconds", "gauge",
           "Seconds from the previous commit to the last one (the round's training, pushes and outer step).",
           Real(s.last_round_seconds()));
}

void WorkerMetrics(const StatusReply& s, Exposition& e) {
  e.Family("diloco_worker_state", "gauge", "1 for each worker's membership state.");
  for (const WorkerStatus& w : s.workers()) {
    e.Sample("diloco_worker_state", {{"worker", w.id()}, {"state", w.state()}}, "1");
  }
  e.Family("diloco_worker_tokens_total", "counter", "Training tokens of the worker in committed rounds.");
  for (const WorkerStatus& w : s.workers()) {
    e.Sample("diloco_worker_tokens_total", {{"worker", w.id()}}, Int(w.tokens()));
  }
  e.Family("diloco_worker_rounds_contributed_total", "counter", "Committed rounds the worker's pushes were part of.");
  for (const WorkerStatus& w : s.workers()) {
    e.Sample("diloco_worker_rounds_contributed_total", {{"worker", w.id()}}, Int(w.rounds_contributed()));
  }
  e.Family("diloco_worker_bytes_pushed_total", "counter",
           "Pseudo-gradient bytes the worker pushed in committed rounds.");
  for (const WorkerStatus& w : s.workers()) {
    e.Sample("diloco_worker_bytes_pushed_total", {{"worker", w.id()}}, Int(w.bytes_pushed()));
  }
  e.Family("diloco_worker_broken_pushes_total", "counter",
           "Pushes of the worker that broke off after folding chunks (each restarted its round's aggregation).");
  for (const WorkerStatus& w : s.workers()) {
    e.Sample("diloco_worker_broken_pushes_total", {{"worker", w.id()}}, Int(w.broken_pushes()));
  }
  e.Family("diloco_worker_quarantined", "gauge",
           "1 while the worker's pushes are refused after repeated broken pushes (until quarantined_until_round).");
  for (const WorkerStatus& w : s.workers()) {
    e.Sample("diloco_worker_quarantined", {{"worker", w.id()}}, w.quarantined_until_round() > 0 ? "1" : "0");
  }
  e.Family("diloco_worker_push_norm", "gauge", "L2 norm of the worker's last counted pseudo-gradient (0 before one).");
  for (const WorkerStatus& w : s.workers()) {
    e.Sample("diloco_worker_push_norm", {{"worker", w.id()}}, Real(w.last_push_norm()));
  }
  e.Family("diloco_worker_clip_scale", "gauge",
           "The factor outer.aggregation clip scaled the worker's last counted push by (1: not clipped).");
  for (const WorkerStatus& w : s.workers()) {
    e.Sample("diloco_worker_clip_scale", {{"worker", w.id()}}, Real(w.last_clip_scale()));
  }
  e.Family(
      "diloco_worker_momentum_cosine", "gauge",
      "outer.momentum_bound (clip, trimmed_mean, centered_clip): the cosine of the worker's last counted push with "
      "the outer momentum.");
  for (const WorkerStatus& w : s.workers()) {
    e.Sample("diloco_worker_momentum_cosine", {{"worker", w.id()}}, Real(w.momentum_cosine()));
  }
  e.Family("diloco_worker_momentum_bounded", "gauge",
           "1 when the worker's last counted push was bounded along the outer momentum (outer.momentum_bound).");
  for (const WorkerStatus& w : s.workers()) {
    e.Sample("diloco_worker_momentum_bounded", {{"worker", w.id()}}, w.momentum_bounded() ? "1" : "0");
  }
  e.Family("diloco_worker_trimmed_share", "gauge",
           "outer.aggregation trimmed_mean: the share of the worker's last counted push's coordinates the trim "
           "dropped.");
  for (const WorkerStatus& w : s.workers()) {
    e.Sample("diloco_worker_trimmed_share", {{"worker", w.id()}}, Real(w.trimmed_share()));
  }
  e.Family(
      "diloco_worker_suspect", "gauge",
      "1 once the worker's pushes lay far beyond the clip, bound or trim (outer.flag_margin) outer.flag_rounds rounds "
      "in a row.");
  for (const WorkerStatus& w : s.workers()) {
    e.Sample("diloco_worker_suspect", {{"worker", w.id()}}, w.suspect() ? "1" : "0");
  }
  e.Family("diloco_worker_duplicate_pushes_total", "counter",
           "The worker's pushes refused as byte-identical to another push of the round or of the previous round.");
  for (const WorkerStatus& w : s.workers()) {
    e.Sample("diloco_worker_duplicate_pushes_total", {{"worker", w.id()}}, Int(w.duplicate_pushes()));
  }
  e.Family("diloco_worker_heartbeat_age_seconds", "gauge", "Seconds since the worker was last heard from.");
  for (const WorkerStatus& w : s.workers()) {
    e.Sample("diloco_worker_heartbeat_age_seconds", {{"worker", w.id()}}, Real(w.heartbeat_age_s()));
  }
  e.Family("diloco_worker_tokens_per_second", "gauge",
           "Inner-loop training throughput of the worker's last push (absent before its first push).");
  for (const WorkerStatus& w : s.workers()) {
    if (HasReported(w)) e.Sample("diloco_worker_tokens_per_second", {{"worker", w.id()}}, Real(w.tokens_per_s()));
  }
  e.Family("diloco_worker_last_loss", "gauge",
           "Training loss (nats/token) the worker reported with its last push (absent before its first push).");
  for (const WorkerStatus& w : s.workers()) {
    if (HasReported(w)) e.Sample("diloco_worker_last_loss", {{"worker", w.id()}}, Real(w.last_loss()));
  }
}

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatSampleValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, result.ptr);
}

std::string MetricsText(const StatusReply& status) {
  Exposition e;
  RunMetrics(status, e);
  TrafficMetrics(status, e);
  WorkerMetrics(status, e);
  return e.Take();
}

}  // namespace diloco
