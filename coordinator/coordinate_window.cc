#include "coordinator/coordinate_window.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "coordinator/aggregation_rule.h"
#include "proto/codec.h"
#include "proto/tensor_chunks.h"

namespace diloco {

bool IsCoordinateWise(Aggregation rule) {
  return rule == Aggregation::kTrimmedMean || rule == Aggregation::kCenteredClip;
}

int IngestThreadsFor(const Config& config) {
  constexpr int kDefault = 2;  // IngestQueue::Options' default
  if (!IsCoordinateWise(config.outer.aggregation) || config.outer.mode != OuterMode::kSync) return kDefault;
  return static_cast<int>(std::max<int64_t>(kDefault, config.workers.count + 2));
}

namespace {

// The elements per chunk of a tensor of `spec`, cut as a worker's TensorChunker cuts it: a float32 tensor's chunks
// encoded with `codec`, any other dtype's raw.
int64_t PushChunkElements(const TensorSpec& spec, Codec codec, int64_t chunk_bytes) {
  return ChunkElements(spec.dtype == at::kFloat ? codec : CODEC_RAW, std::max(chunk_bytes, kMinChunkBytes),
                       static_cast<int64_t>(at::elementSize(spec.dtype)));
}

}  // namespace

CoordinateWindow::Options CoordinateWindowOptionsOf(const Config& config, const std::vector<TensorSpec>& specs) {
  CoordinateWindow::Options o;
  o.rule = config.outer.aggregation;
  o.trim = config.outer.trim;
  o.iterations = config.outer.cclip_iterations;
  o.tau = config.outer.cclip_tau;
  o.window_chunks = config.outer.window_chunks;
  o.max_members = static_cast<size_t>(IngestThreadsFor(config) - 1);
  for (const TensorSpec& spec : specs) {
    o.chunk_elements.push_back(PushChunkElements(spec, CodecOf(config.comm.codec), config.comm.chunk_bytes));
    o.numel.push_back(spec.numel());
  }
  return o;
}

std::string PushPartsMismatch(const Config& config, int push_parts) {
  if (push_parts <= 1 || config.outer.mode != OuterMode::kSync) return "";
  const Aggregation rule = config.outer.aggregation;
  if (rule != Aggregation::kClip && !IsCoordinateWise(rule)) return "";
  return absl::StrCat("outer.aggregation ", std::string(EnumName(rule)), " takes each push in one stream (",
                      rule == Aggregation::kClip ? "it clips each stream by its claimed norm"
                                                 : "it reduces chunk s of every whole push together",
                      ") and this worker pushes in ", push_parts,
                      " parts (comm.cluster_parts with workers.cluster_size ", push_parts,
                      "); set comm.cluster_parts false in the worker's config, or use the coordinator's config");
}

std::string PushChunkingMismatch(const Config& config, const std::vector<TensorSpec>& specs, Codec push_codec,
                                 int64_t chunk_bytes) {
  if (!IsCoordinateWise(config.outer.aggregation) || chunk_bytes == 0) return "";
  const std::string rule(EnumName(config.outer.aggregation));
  if (push_codec == CODEC_TOPK || push_codec == CODEC_UPDATE || !Codec_IsValid(push_codec)) {
    return absl::StrCat("outer.aggregation ", rule, " needs pushes in a dense comm.codec; the worker's is ",
                        Codec_IsValid(push_codec) ? CodecName(push_codec) : absl::StrCat("unknown (", push_codec, ")"));
  }
  const Codec own = CodecOf(config.comm.codec);
  for (const TensorSpec& spec : specs) {
    const int64_t theirs = PushChunkElements(spec, push_codec, chunk_bytes);
    const int64_t ours = PushChunkElements(spec, own, config.comm.chunk_bytes);
    if (theirs != ours) {
      return absl::StrCat("outer.aggregation ", rule, " reduces chunk s of every push together, and the worker's ",
                          "comm.codec ", CodecName(push_codec), " with comm.chunk_bytes ", chunk_bytes, " cuts '",
                          spec.name, "' into chunks of ", theirs, " elements where the coordinator's (", CodecName(own),
                          ", ", config.comm.chunk_bytes, ") cut ", ours, "; use the coordinator's comm.codec and ",
                          "comm.chunk_bytes");
    }
  }
  return "";
}

bool CoordinateWindow::TryOpen(const std::vector<std::string>& expected, bool force, size_t min_declared) {
  if (open_) return true;
  std::set<std::string> live;  // declared and still expected
  for (const std::string& id : expected) {
    if (declared_.count(id) != 0) live.insert(id);
  }
  const bool all = !live.empty() && live.size() == expected.size();  // expected: distinct ids
  const bool full = live.size() >= options_.max_members;
  if (!(all || force || full) || live.size() < std::max<size_t>(min_declared, 1)) return false;
  for (const std::string& id : live) {
    if (members_.size() >= options_.max_members) break;
    slots_[id] = members_.size();
    members_[id] = Member{};
  }
  trimmed_.assign(members_.size(), 0);
  open_ = true;
  return true;
}

bool CoordinateWindow::HasRoom(const std::string& id) const {
  auto it = members_.find(id);
  return it != members_.end() && it->second.next < reduced_ + options_.window_chunks;
}

absl::StatusOr<std::optional<CoordinateWindow::Reduced>> CoordinateWindow::Put(const std::string& id, size_t index,
                                                                               int64_t offset,
                                                                               const at::Tensor& values) {
  Member& m = members_.at(id);
  const int64_t position = m.next;
  if (index < options_.chunk_elements.size()) {  // the coordinator's chunking is the reference
    const int64_t e = options_.chunk_elements[index], numel = options_.numel[index];
    if (offset % e != 0 || values.numel() != std::min(e, numel - offset)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", position, " of this push (tensor ", index, ", elements [", offset, ", ", offset + values.numel(),
          ")) is not cut as the coordinator's comm.codec and comm.chunk_bytes cut it (", e,
          " elements a chunk): with a coordinate-wise outer.aggregation every push must use the coordinator's "
          "chunking"));
    }
  }
  Pending& p = pending_[position];
  if (p.rows.empty()) {
    p.index = index;
    p.offset = offset;
    p.count = values.numel();
    p.rows.resize(members_.size());
  } else if (p.index != index || p.offset != offset || p.count != values.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", position, " of this push (tensor ", index, ", elements [", offset, ", ", offset + values.numel(),
        ")) does not line up with the other pushes' (tensor ", p.index, ", elements [", p.offset, ", ",
        p.offset + p.count, ")): with a coordinate-wise outer.aggregation every push must use the same chunking"));
  }
  p.rows[slots_.at(id)] = values.to(at::kFloat).clone();
  ++p.arrived;
  ++m.next;
  if (p.arrived < members_.size()) return std::optional<Reduced>();
  // Chunks complete in stream order: a chunk's last row comes from the slowest member, which sent the earlier ones.
  Reduced r{p.index, p.offset, Reduce(at::stack(p.rows))};
  pending_.erase(position);
  ++reduced_;
  return std::optional<Reduced>(std::move(r));
}

at::Tensor CoordinateWindow::Reduce(const at::Tensor& rows) {
  coordinates_ += rows.size(1);
  if (options_.rule == Aggregation::kTrimmedMean) return TrimmedMean(rows, options_.trim, &trimmed_);
  return CenteredClip(rows, options_.tau, options_.iterations);  // tau <= 0: derived from the rows
}

bool CoordinateWindow::Finish(const std::string& id) {
  Member& m = members_.at(id);
  if (finished_count_ >= 0 && m.next != finished_count_) return false;
  finished_count_ = m.next;
  m.finished = true;
  return true;
}

bool CoordinateWindow::complete() const {
  if (!open_) return false;
  for (const auto& [id, m] : members_) {
    if (!m.finished) return false;
  }
  return pending_.empty();
}

std::vector<std::string> CoordinateWindow::Unfinished() const {
  std::vector<std::string> ids;
  for (const auto& [id, m] : members_) {
    if (!m.finished) ids.push_back(id);
  }
  return ids;
}

std::vector<std::string> CoordinateWindow::Laggards() const {
  int64_t slowest = std::numeric_limits<int64_t>::max();
  for (const auto& [id, m] : members_) {
    if (!m.finished) slowest = std::min(slowest, m.next);
  }
  std::vector<std::string> ids;
  for (const auto& [id, m] : members_) {
    if (!m.finished && m.next == slowest) ids.push_back(id);
  }
  return ids;
}

int64_t CoordinateWindow::held_chunks() const {
  int64_t n = 0;
  for (const auto& [position, p] : pending_) n += static_cast<int64_t>(p.arrived);
  return n;
}

double CoordinateWindow::TrimmedShare(const std::string& id) const {
  auto it = slots_.find(id);
  if (it == slots_.end() || coordinates_ == 0) return 0;
  return static_cast<double>(trimmed_[it->second]) / static_cast<double>(coordinates_);
}

void CoordinateWindow::Reset() {
  declared_.clear();
  open_ = false;
  slots_.clear();
  members_.clear();
  pending_.clear();
  reduced_ = 0;
  finished_count_ = -1;
  trimmed_.clear();
  coordinates_ = 0;
  progress_at_ = 0;
}

}  // namespace diloco
