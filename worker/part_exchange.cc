// PartExchange and PartLeader (worker/part_exchange.h): a cluster's pushes and pulls in parts.
#include "worker/part_exchange.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "proto/codec.h"
#include "proto/tensor_chunks.h"
#include "proto/transport_security.h"
#include "worker/cluster.h"
#include "worker/cluster_protocol.h"
#include "worker/free_memory.h"
#include "worker/local_state.h"

namespace diloco {
namespace {

std::chrono::milliseconds OutcomeTimeout(const Config& config) {  // the leader's push header (put before the command)
  return std::chrono::milliseconds(
      static_cast<int64_t>((config.workers.rpc_timeout_s + config.workers.cluster_timeout_s) * 1000));
}

std::string Key(const char* what, int64_t seq, int rank) { return absl::StrCat(what, "/", seq, "/", rank); }

// Severity of a part's outcome when folding the ranks' (higher wins; see PartLeader).
int Severity(const absl::Status& s) {
  if (s.ok()) return 0;
  if (absl::IsAborted(s)) return 1;
  if (absl::IsUnavailable(s)) return 2;
  return 3;
}

}  // namespace

std::string EncodePartOutcome(const absl::Status& status, const PullResult& result) {
  return absl::StrCat(static_cast<int>(status.code()), "\t", result.round, "\t", result.bytes, "\t",
                      result.run_complete ? 1 : 0, "\t", result.inner_steps, "\t", status.message());
}

absl::Status DecodePartOutcome(const std::string& text, PullResult* result) {
  std::vector<std::string> f = absl::StrSplit(text, absl::MaxSplits('\t', 5));
  int code = 0, complete = 0;
  if (f.size() != 6 || !absl::SimpleAtoi(f[0], &code) || !absl::SimpleAtoi(f[1], &result->round) ||
      !absl::SimpleAtoi(f[2], &result->bytes) || !absl::SimpleAtoi(f[3], &complete) ||
      !absl::SimpleAtoi(f[4], &result->inner_steps)) {
    return absl::InternalError(absl::StrCat("a rank's part outcome is garbled: '", text, "'"));
  }
  result->run_complete = complete != 0;
  return absl::Status(static_cast<absl::StatusCode>(code), f[5]);
}

absl::StatusOr<std::unique_ptr<PartExchange>> PartExchange::Open(const Config& config, const WorkerOptions& options,
                                                                 const std::string& fingerprint, WorkerCluster& cluster,
                                                                 NamedTensors params, const FlatAdamW* optimizer) {
  const SecurityConfig& sec = config.security;
  auto security = LoadTransportSecurity({sec.tls_cert, sec.tls_key, sec.tls_ca, sec.token_file, sec.server_name});
  if (!security.ok()) return WithExitCode(security.status(), kWorkerConfigError);
  auto client =
      std::make_unique<CoordinatorClient>(options.coordinator, options.id, fingerprint, config.workers.rpc_timeout_s,
                                          config.comm.chunk_bytes, CodecOf(config.comm.codec), std::move(*security));
  std::unique_ptr<PartExchange> exchange(new PartExchange(config, cluster, std::move(params), std::move(client)));
  const SlicePlan& plan = exchange->plan_;
  if (optimizer != nullptr && optimizer->sharded() && optimizer->flat_parameters().numel() == plan.numel() &&
      optimizer->padded_parameters().numel() == plan.padded_numel() &&
      optimizer->gradient_piece().numel() == plan.slice_length()) {
    exchange->padded_ = optimizer->padded_parameters();
  }
  return exchange;
}

PartExchange::PartExchange(const Config& config, WorkerCluster& cluster, NamedTensors params,
                           std::unique_ptr<CoordinatorClient> client)
    : config_(config),
      cluster_(cluster),
      params_(std::move(params)),
      specs_(SpecsOf(params_)),
      plan_(0, 1, 1),
      client_(std::move(client)),
      codec_(CodecOf(config.comm.codec)),
      topk_{config.comm.topk_chunk, config.comm.topk_per_chunk} {
  int64_t numel = 0;
  for (const TensorSpec& spec : specs_) {
    starts_.push_back(numel);
    numel += spec.numel();
  }
  const int64_t align = std::max<int64_t>(config.comm.chunk_bytes, kMinChunkBytes) / 4;
  plan_ = SlicePlan(numel, cluster.size(), align);
  mine_ = plan_.slice(cluster.rank());
  feedback_ = codec_ == CODEC_TOPK || (config.comm.error_feedback && codec_ != CODEC_RAW);
  beta_ = codec_ == CODEC_TOPK ? config.comm.error_decay : 1.0;
  snapshot_ = torch::zeros({mine_.size()}, torch::kFloat);
}

torch::Tensor PartExchange::SliceOfParameters() const {
  torch::NoGradGuard no_grad;
  if (padded_.defined()) return padded_.narrow(0, mine_.begin, mine_.size()).to(torch::kCPU);
  torch::Tensor out = torch::empty({mine_.size()}, torch::kFloat);
  for (size_t i = 0; i < specs_.size(); ++i) {
    const int64_t lo = std::clamp(mine_.begin - starts_[i], int64_t{0}, specs_[i].numel());
    const int64_t hi = std::clamp(mine_.end - starts_[i], int64_t{0}, specs_[i].numel());
    if (hi <= lo) continue;
    out.narrow(0, starts_[i] + lo - mine_.begin, hi - lo)
        .copy_(params_[i].second.detach().reshape({-1}).narrow(0, lo, hi - lo));
  }
  return out;
}

void PartExchange::RestoreResidual(const torch::Tensor& saved) {
  if (!saved.defined()) return;
  if (!feedback_ || saved.numel() != mine_.size()) {
    spdlog::warn("ignoring the saved slice residual ({} elements): this rank keeps {}", saved.numel(),
                 feedback_ ? absl::StrCat(mine_.size(), " elements") : std::string("none (no error feedback)"));
    return;
  }
  residual_ = saved.to(torch::kCPU, torch::kFloat).reshape({-1}).clone();
  spdlog::info("error feedback: restored this rank's slice residual ({} elements, |residual| = {:.9g})",
               residual_.numel(), residual_.norm().item<double>());
}

void PartExchange::TakeSnapshot() {
  snapshot_.copy_(SliceOfParameters());  // into the same buffer: no second slice meanwhile
  DropDelta();
}

torch::Tensor PartExchange::RoundTrip(const torch::Tensor& values) const {
  // Exactly the chunks the push sends, decoded as the coordinator decodes them.
  TensorChunker chunker(specs_, values, config_.comm.chunk_bytes, codec_, mine_, topk_);
  ChunkStreamReader reader(specs_, mine_);
  torch::Tensor sent = torch::empty_like(values);
  TensorChunk chunk;
  while (chunker.Next(&chunk)) {
    absl::StatusOr<at::Tensor> decoded = reader.Next(chunk);
    if (!decoded.ok()) throw std::logic_error(std::string(decoded.status().message()));
    const int64_t at = starts_[reader.tensor_index()] + reader.chunk_offset() - mine_.begin;
    sent.narrow(0, at, decoded->numel()).copy_(*decoded);
  }
  return sent;
}

const torch::Tensor& PartExchange::PseudoGradientSlice() {
  if (!delta_ready_) PrepareDelta();
  return delta_;
}

void PartExchange::PrepareDelta() {
  // The round's inner steps are over (with comm.overlap_steps the next round's run beside): what their activations
  // left in the allocator is handed back first, so that the slice does not come on top of it. Once a round.
  if (snapshot_.device().is_cpu()) ReturnFreeMemory();
  delta_ = snapshot_ - SliceOfParameters();
  if (feedback_) {
    Settle(true);  // a push never settled: its residual stands
    previous_residual_ = residual_;
    unsettled_ = true;
    const torch::Tensor before = residual_.defined() ? residual_ : torch::zeros_like(delta_);
    delta_.add_(before, beta_);
    residual_ = delta_ - RoundTrip(delta_);  // a new tensor: the one before stays until Settle
  }
  delta_ready_ = true;
}

absl::StatusOr<int64_t> PartExchange::PushMine(const PushHeader& member_header) {
  PseudoGradientSlice();
  PushHeader header = member_header;
  header.set_part(cluster_.rank());
  header.set_parts(cluster_.size());
  header.mutable_range()->set_begin(mine_.begin);
  header.mutable_range()->set_end(mine_.end);
  TensorChunker chunker(specs_, delta_, config_.comm.chunk_bytes, codec_, mine_, topk_);
  return client_->PushPart(header, chunker);
}

absl::StatusOr<PullResult> PartExchange::PullMine() {
  ChunkStreamReader reader(specs_, mine_);
  auto accept = [&](const TensorChunk& chunk) -> absl::Status {
    absl::StatusOr<at::Tensor> values = reader.Next(chunk);
    if (!values.ok()) return values.status();
    const int64_t at = starts_[reader.tensor_index()] + reader.chunk_offset() - mine_.begin;
    snapshot_.narrow(0, at, values->numel()).copy_(*values);
    return absl::OkStatus();
  };
  DropDelta();  // the snapshot changes (or is half written, then pulled again)
  absl::StatusOr<PullResult> pulled = client_->PullPart(-1, mine_.begin, mine_.end, accept);
  if (pulled.ok() && !reader.Done()) return absl::DataLossError("pull of a part: stream ended before its slice came");
  return pulled;
}

void PartExchange::DropDelta() {
  delta_ready_ = false;
  if (!delta_.defined()) return;
  // Freed now, not when the next round's slice is taken (never two slices at once), and handed back to the kernel
  // once a round: the allocator would otherwise keep the slice resident beside the next steps' activations.
  delta_ = torch::Tensor();
  if (snapshot_.device().is_cpu()) ReturnFreeMemory();
}

void PartExchange::GatherIntoParameters() {
  torch::NoGradGuard no_grad;
  DropDelta();
  if (padded_.defined()) {  // the parameters are views of padded_: gathered in place
    torch::Tensor piece = padded_.narrow(0, cluster_.rank() * plan_.slice_length(), plan_.slice_length());
    piece.narrow(0, 0, mine_.size()).copy_(snapshot_);
    cluster_.AllGather(piece, padded_);
    return;
  }
  const torch::Device device = params_.empty() ? torch::Device(torch::kCPU) : params_[0].second.device();
  torch::Tensor all = torch::empty({plan_.padded_numel()}, torch::TensorOptions(torch::kFloat).device(device));
  torch::Tensor piece = all.narrow(0, cluster_.rank() * plan_.slice_length(), plan_.slice_length());
  piece.narrow(0, 0, mine_.size()).copy_(snapshot_);
  cluster_.AllGather(piece, all);
  for (size_t i = 0; i < specs_.size(); ++i) {
    params_[i].second.detach().view({-1}).copy_(all.narrow(0, starts_[i], specs_[i].numel()));
  }
}

absl::StatusOr<int64_t> PartLeader::Push(int64_t round, const RoundReport& report) {
  const int64_t seq = seq_++;
  PushHeader header;
  header.mutable_meta()->set_round(round);
  FillPushHeader(report, &header);
  // A new attempt for every push, larger than the last even across a restart of this process (microseconds of the
  // clock): the coordinator takes a part of a newer attempt as the member pushing over (PROTOCOL.md "Pushing over").
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch());
  last_attempt_ = std::max(last_attempt_ + 1, static_cast<uint64_t>(micros.count()));
  header.set_attempt(last_attempt_);
  const std::string bytes = header.SerializeAsString();
  for (int r = 1; r < cluster_.size(); ++r) cluster_.Put(Key("hdr", seq, r), bytes);
  leader_.Send(PushPartCommand{round, seq});
  absl::StatusOr<int64_t> mine = mine_.PushMine(header);
  absl::Status folded = mine.status();
  int64_t bytes_sent = mine.ok() ? *mine : 0;
  for (int r = 1; r < cluster_.size(); ++r) {
    PullResult outcome;
    const absl::Status theirs = DecodePartOutcome(cluster_.TakeFromLiving(r, Key("out", seq, r)), &outcome);
    if (Severity(theirs) > Severity(folded))
      folded = absl::Status(theirs.code(), absl::StrCat("rank ", r, "'s part: ", theirs.message()));
    bytes_sent += outcome.bytes;
  }
  if (!folded.ok()) return folded;
  return bytes_sent;
}

absl::StatusOr<PullResult> PartLeader::Pull() {
  const int64_t seq = seq_++;
  leader_.Send(PullPartCommand{seq});
  absl::StatusOr<PullResult> mine = mine_.PullMine();
  absl::Status folded = mine.status();
  PullResult result = mine.ok() ? *mine : PullResult();
  for (int r = 1; r < cluster_.size(); ++r) {
    PullResult theirs;
    const absl::Status status = DecodePartOutcome(cluster_.TakeFromLiving(r, Key("out", seq, r)), &theirs);
    if (Severity(status) > Severity(folded))
      folded = absl::Status(status.code(), absl::StrCat("rank ", r, "'s part: ", status.message()));
    if (folded.ok() && theirs.round != result.round) {
      folded = absl::UnavailableError(
          absl::StrCat("the ranks pulled different rounds (", result.round, " and ", theirs.round, "): pulling again"));
    }
    result.bytes += theirs.bytes;
  }
  if (!folded.ok()) return folded;
  return result;
}

void PartLeader::Gather() {
  leader_.Send(GatherCommand{});
  mine_.GatherIntoParameters();
}

void PartLeader::Settle(bool counted) {
  leader_.Send(SettleCommand{counted});
  mine_.Settle(counted);
}

void PartExchange::Settle(bool counted) {
  if (!unsettled_) return;
  unsettled_ = false;
  if (!counted) residual_ = previous_residual_;
  previous_residual_ = torch::Tensor();
}

void ServePartPush(WorkerCluster& cluster, PartExchange& exchange, int64_t seq, const Config& config) {
  PushHeader header;
  PullResult outcome;
  absl::Status status;
  if (!header.ParseFromString(cluster.Take(Key("hdr", seq, cluster.rank()), OutcomeTimeout(config)))) {
    status = absl::InternalError("the leader's push header does not parse");
  } else {
    absl::StatusOr<int64_t> pushed = exchange.PushMine(header);
    status = pushed.status();
    if (pushed.ok()) outcome.bytes = *pushed;
  }
  cluster.Put(Key("out", seq, cluster.rank()), EncodePartOutcome(status, outcome));
}

void ServePartPull(WorkerCluster& cluster, PartExchange& exchange, int64_t seq) {
  absl::StatusOr<PullResult> pulled = exchange.PullMine();
  cluster.Put(Key("out", seq, cluster.rank()),
              EncodePartOutcome(pulled.status(), pulled.ok() ? *pulled : PullResult()));
}

namespace {

class RankParts : public FollowerParts {
 public:
  RankParts(const Config& config, WorkerCluster& cluster, std::unique_ptr<PartExchange> exchange)
      : config_(config), cluster_(cluster), exchange_(std::move(exchange)) {}
  void Loaded() override { exchange_->TakeSnapshot(); }
  void Push(const PushPartCommand& command) override { ServePartPush(cluster_, *exchange_, command.seq, config_); }
  void Pull(const PullPartCommand& command) override { ServePartPull(cluster_, *exchange_, command.seq); }
  void Gather() override { exchange_->GatherIntoParameters(); }
  void Settle(bool counted) override { exchange_->Settle(counted); }

 private:
  const Config& config_;
  WorkerCluster& cluster_;
  std::unique_ptr<PartExchange> exchange_;
};

}  // namespace

FollowerPartsFactory FollowerPartsOf(const Config& config, const WorkerOptions& options, WorkerCluster& cluster) {
  if (!config.comm.cluster_parts) return {};
  return [&config, options, &cluster](InnerTrainer& trainer,
                                      LocalState& local) -> absl::StatusOr<std::unique_ptr<FollowerParts>> {
    const NamedTensors params = NamedParameters(*trainer.model());
    auto exchange =
        PartExchange::Open(config, options, Fingerprint(SpecsOf(params)), cluster, params, &trainer.optimizer());
    if (!exchange.ok()) return exchange.status();
    PartExchange* mine = exchange->get();  // the RankParts below owns it; it outlives the follower's saves
    mine->RestoreResidual(local.KeepSliceResidual([mine] { return mine->residual(); }));
    return std::unique_ptr<FollowerParts>(new RankParts(config, cluster, std::move(*exchange)));
  };
}

}  // namespace diloco
