#include "worker/worker_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "worker/lm/safetensors.h"

namespace diloco {
namespace {

constexpr const char* kFormat = "diloco-worker-state-1";

using Metadata = std::map<std::string, std::string>;

void PutIdentity(const StateIdentity& id, Metadata& m) {
  m["worker_id"] = id.worker_id;
  m["fingerprint"] = id.fingerprint;
  m["seed"] = absl::StrCat(id.seed);
  m["data"] = id.data;
  m["shard"] = absl::StrCat(id.shard);
  m["shard_count"] = absl::StrCat(id.shard_count);
  m["sampling"] = id.sampling;
  m["cluster_rank"] = absl::StrCat(id.cluster_rank);
  m["cluster_size"] = absl::StrCat(id.cluster_size);
  m["slice_layout"] = id.slice_layout;
  if (!id.windows.empty()) m["windows"] = id.windows;
}

void PutSampler(const SamplerState& s, Metadata& m) {
  m["sampler_epoch"] = absl::StrCat(s.epoch);
  m["sampler_position"] = absl::StrCat(s.position);
  m["sampler_rng"] = s.rng;
}

// Reads the keys PutIdentity / PutSampler wrote; an error names the first missing or malformed key. The cluster keys
// were added when clusters began to keep state: a file without them is a one-process worker's (rank 0 of 1, none);
// "windows" later still: without it, "" (not compared).
absl::Status GetAll(const Metadata& m, StateIdentity* id, SamplerState* s) {
  if (auto it = m.find("windows"); it != m.end()) id->windows = it->second;
  auto text = [&](const char* key, std::string* out) -> absl::Status {
    auto it = m.find(key);
    if (it == m.end()) return absl::DataLossError(absl::StrCat("missing key '", key, "'"));
    *out = it->second;
    return absl::OkStatus();
  };
  auto number = [&](const char* key, int64_t* out) -> absl::Status {
    std::string v;
    if (absl::Status st = text(key, &v); !st.ok()) return st;
    if (!absl::SimpleAtoi(v, out)) return absl::DataLossError(absl::StrCat("key '", key, "' is not an integer"));
    return absl::OkStatus();
  };
  const bool cluster_keys = m.count("cluster_rank") != 0;
  for (absl::Status st :
       {text("worker_id", &id->worker_id), text("fingerprint", &id->fingerprint), number("seed", &id->seed),
        text("data", &id->data), number("shard", &id->shard), number("shard_count", &id->shard_count),
        text("sampling", &id->sampling), number("sampler_epoch", &s->epoch), number("sampler_position", &s->position),
        text("sampler_rng", &s->rng)}) {
    if (!st.ok()) return st;
  }
  if (!cluster_keys) return absl::OkStatus();
  for (absl::Status st : {number("cluster_rank", &id->cluster_rank), number("cluster_size", &id->cluster_size),
                          text("slice_layout", &id->slice_layout)}) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace

std::string StateKey(const std::string& worker_id, int64_t cluster_rank, int64_t cluster_size) {
  return cluster_size > 1 ? absl::StrCat(worker_id, ".rank-", cluster_rank) : worker_id;
}

std::string StatePath(const std::string& dir, const std::string& worker_id) {
  return absl::StrCat(dir, "/", worker_id, ".state");
}
std::string PreviousStatePath(const std::string& dir, const std::string& worker_id) {
  return absl::StrCat(StatePath(dir, worker_id), ".prev");
}
std::string PositionPath(const std::string& dir, const std::string& worker_id) {
  return absl::StrCat(dir, "/", worker_id, ".position");
}
std::string WindowsPath(const std::string& dir, const std::string& worker_id) {
  return absl::StrCat(dir, "/", worker_id, ".windows");
}

std::string WhyNotResume(const StateIdentity& saved, const StateIdentity& current) {
  auto differ = [](const char* what, const auto& a, const auto& b) -> std::string {
    return absl::StrCat(what, " differs (saved ", a, ", this run ", b, ")");
  };
  if (saved.worker_id != current.worker_id) return differ("worker id", saved.worker_id, current.worker_id);
  if (saved.fingerprint != current.fingerprint) {
    return differ("model fingerprint", saved.fingerprint, current.fingerprint);
  }
  if (saved.seed != current.seed) return differ("run.seed", saved.seed, current.seed);
  if (saved.data != current.data) return differ("token data", saved.data, current.data);
  if (saved.shard != current.shard || saved.shard_count != current.shard_count) {
    return differ("data shard", absl::StrCat(saved.shard, " of ", saved.shard_count),
                  absl::StrCat(current.shard, " of ", current.shard_count));
  }
  if (saved.sampling != current.sampling) return differ("data.sampling", saved.sampling, current.sampling);
  if (saved.cluster_rank != current.cluster_rank || saved.cluster_size != current.cluster_size) {
    return differ("cluster rank", absl::StrCat(saved.cluster_rank, " of ", saved.cluster_size),
                  absl::StrCat(current.cluster_rank, " of ", current.cluster_size));
  }
  if (saved.slice_layout != current.slice_layout) {
    return differ("workers.sharding slice layout", saved.slice_layout, current.slice_layout);
  }
  return "";
}

std::string WhyNotResumePosition(const StateIdentity& saved, const StateIdentity& current) {
  if (saved.windows.empty() || saved.windows == current.windows) return "";
  return absl::StrCat("the data windows differ (saved ", saved.windows, ", this run ", current.windows, ")");
}

std::string WindowsOf(int64_t seq_len, const std::string& split, int64_t ranks) {
  return absl::StrCat("seq_len ", seq_len, ", data.split ", split,
                      ranks > 1 ? absl::StrCat(", the shard cut among ", ranks, " ranks") : std::string());
}

std::string SliceLayout(int64_t numel, bool sharded, bool own_gradient_slice, int64_t parts, int64_t slice_length) {
  if (!sharded) return "none";
  return absl::StrCat(own_gradient_slice ? "gradients " : "optimizer ", numel, " in ", parts, " slices of ",
                      slice_length);
}

std::string MarkText(const SaveMark& mark) { return absl::StrCat(mark.round, "@", mark.adam_steps); }

std::optional<SaveMark> ParseMark(absl::string_view text) {
  const std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(text, absl::MaxSplits('@', 1));
  SaveMark mark;
  if (!absl::SimpleAtoi(parts.first, &mark.round) || !absl::SimpleAtoi(parts.second, &mark.adam_steps)) {
    return std::nullopt;
  }
  return mark;
}

ResumeAgreement AgreeOnResumeRound(const std::vector<std::vector<SaveMark>>& marks_per_rank) {
  std::string listed;
  for (size_t r = 0; r < marks_per_rank.size(); ++r) {
    absl::StrAppend(&listed, r == 0 ? "" : "; ", "rank ", r, ": ",
                    marks_per_rank[r].empty()
                        ? "none"
                        : absl::StrJoin(marks_per_rank[r], ",",
                                        [](std::string* out, const SaveMark& m) { out->append(MarkText(m)); }));
  }
  std::optional<SaveMark> best;
  if (!marks_per_rank.empty()) {
    for (const SaveMark& candidate : marks_per_rank[0]) {
      const bool everywhere = std::all_of(marks_per_rank.begin(), marks_per_rank.end(), [&](const auto& marks) {
        return std::find(marks.begin(), marks.end(), candidate) != marks.end();
      });
      const bool newer = !best || candidate.round > best->round ||
                         (candidate.round == best->round && candidate.adam_steps > best->adam_steps);
      if (everywhere && newer) best = candidate;
    }
  }
  if (!best) return {std::nullopt, absl::StrCat("no save that every rank has (", listed, ")")};
  return {best, absl::StrCat("round ", best->round, " at AdamW step ", best->adam_steps,
                             ", the newest save that every rank has (", listed, ")")};
}

absl::Status SaveWorkerState(const std::string& path, const WorkerState& state) {
  Metadata m{{"format", kFormat}, {"round", absl::StrCat(state.round)}, {"adam_steps", absl::StrCat(state.adam_steps)}};
  PutIdentity(state.identity, m);
  PutSampler(state.sampler, m);
  const torch::Tensor avg = state.exp_avg.to(torch::kCPU).contiguous();
  const torch::Tensor avg_sq = state.exp_avg_sq.to(torch::kCPU).contiguous();
  std::vector<SafetensorsEntry> entries{
      {"exp_avg", {avg.numel()}, avg.data_ptr<float>(), SafetensorsDtype::kF32},
      {"exp_avg_sq", {avg_sq.numel()}, avg_sq.data_ptr<float>(), SafetensorsDtype::kF32}};
  std::vector<torch::Tensor> residuals;  // keeps the CPU copies alive until written
  for (size_t f = 0; f < state.error_feedback.size(); ++f) {
    if (!state.error_feedback[f].defined()) continue;
    residuals.push_back(state.error_feedback[f].to(torch::kCPU, torch::kFloat).contiguous().view({-1}));
    entries.push_back({absl::StrCat("error_feedback.", f),
                       {residuals.back().numel()},
                       residuals.back().data_ptr<float>(),
                       SafetensorsDtype::kF32});
  }
  if (state.slice_residual.defined()) {
    residuals.push_back(state.slice_residual.to(torch::kCPU, torch::kFloat).contiguous().view({-1}));
    entries.push_back(
        {"slice_residual", {residuals.back().numel()}, residuals.back().data_ptr<float>(), SafetensorsDtype::kF32});
  }
  return WriteSafetensors(path, entries, m);
}

absl::StatusOr<WorkerState> LoadWorkerState(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return absl::NotFoundError(absl::StrCat(path, ": no saved state"));
  Metadata m;
  auto tensors = ReadSafetensors(path, &m);
  if (!tensors.ok()) return tensors.status();
  if (m["format"] != kFormat) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a worker state (format '", m["format"], "')"));
  }
  WorkerState state;
  absl::Status st = GetAll(m, &state.identity, &state.sampler);
  if (st.ok() &&
      (!absl::SimpleAtoi(m["round"], &state.round) || !absl::SimpleAtoi(m["adam_steps"], &state.adam_steps))) {
    st = absl::DataLossError("round or adam_steps is not an integer");
  }
  if (!st.ok()) return absl::DataLossError(absl::StrCat(path, ": ", st.message()));
  for (auto& [name, t] : *tensors) {
    if (name == "exp_avg") state.exp_avg = t;
    if (name == "exp_avg_sq") state.exp_avg_sq = t;
    if (name == "slice_residual") state.slice_residual = t;
    size_t fragment = 0;
    if (absl::StartsWith(name, "error_feedback.") && absl::SimpleAtoi(absl::string_view(name).substr(15), &fragment) &&
        fragment < 4096) {
      if (state.error_feedback.size() <= fragment) state.error_feedback.resize(fragment + 1);
      state.error_feedback[fragment] = t;
    }
  }
  if (!state.exp_avg.defined() || !state.exp_avg_sq.defined() || state.exp_avg.numel() != state.exp_avg_sq.numel()) {
    return absl::DataLossError(absl::StrCat(path, ": exp_avg and exp_avg_sq missing or of different sizes"));
  }
  return state;
}

absl::Status SavePosition(const std::string& path, const StateIdentity& identity, const SamplerState& sampler) {
  Metadata m;
  PutIdentity(identity, m);
  PutSampler(sampler, m);
  const std::string text = nlohmann::json(m).dump();
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!written || std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::DataLossError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<StateIdentity, SamplerState>> LoadPosition(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": no saved position"));
  Metadata m;
  try {
    m = nlohmann::json::parse(in).get<Metadata>();
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": ", e.what()));
  }
  std::pair<StateIdentity, SamplerState> out;
  absl::Status st = GetAll(m, &out.first, &out.second);
  if (!st.ok()) return absl::DataLossError(absl::StrCat(path, ": ", st.message()));
  return out;
}

}  // namespace diloco
