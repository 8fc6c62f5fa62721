#include "proto/tensor_chunks.h"

#include <algorithm>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/peer_text.h"
#include "proto/sparse_update.h"

namespace diloco {
namespace {

// A peer's shape in a refusal: at most 8 dimensions are printed (a chunk may claim 200,000).
std::string ShapeForMessage(const google::protobuf::RepeatedField<int64_t>& shape) {
  constexpr int kShown = 8;
  if (shape.size() <= kShown) return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
  return absl::StrCat("[", absl::StrJoin(shape.begin(), shape.begin() + kShown, ","), ",... (", shape.size(),
                      " dimensions)]");
}

}  // namespace

TensorChunker::TensorChunker(NamedTensors tensors, int64_t chunk_bytes, Codec codec, TopkParams topk)
    : tensors_(std::move(tensors)),
      chunk_bytes_(std::max<int64_t>(chunk_bytes, kMinChunkBytes)),
      codec_(codec),
      topk_(topk) {
  for (auto& [name, t] : tensors_) {
    t = t.contiguous();
    remaining_ += t.numel();
    origin_.push_back(0);
    shape_.push_back(t.sizes().vec());
    numel_.push_back(t.numel());
  }
}

TensorChunker::TensorChunker(const std::vector<TensorSpec>& specs, at::Tensor range_values, int64_t chunk_bytes,
                             Codec codec, FlatRange range, TopkParams topk)
    : chunk_bytes_(std::max<int64_t>(chunk_bytes, kMinChunkBytes)), codec_(codec), topk_(topk) {
  int64_t total = 0;
  for (const TensorSpec& spec : specs) total += spec.numel();
  if (range.begin < 0 || range.end < range.begin || range.end > total || range_values.numel() != range.size()) {
    throw std::out_of_range(absl::StrCat("chunk range [", range.begin, ", ", range.end, ") outside the ", total,
                                         " elements or not the ", range_values.numel(), " values given"));
  }
  range_values = range_values.contiguous().view({-1});
  int64_t start = 0;  // flat index of the tensor's first element
  for (const TensorSpec& spec : specs) {
    const int64_t lo = std::clamp(range.begin - start, int64_t{0}, spec.numel());
    const int64_t hi = std::clamp(range.end - start, int64_t{0}, spec.numel());
    tensors_.emplace_back(
        spec.name, hi > lo ? range_values.narrow(0, start + lo - range.begin, hi - lo) : range_values.narrow(0, 0, 0));
    origin_.push_back(lo);
    shape_.push_back(spec.shape);
    numel_.push_back(spec.numel());
    start += spec.numel();
  }
  int64_t skip = range.begin;
  while (index_ < tensors_.size() && skip >= numel_[index_]) skip -= numel_[index_++];
  offset_ = skip;
  remaining_ = range.size();
}

TensorChunker::TensorChunker(NamedTensors tensors, int64_t chunk_bytes, Codec codec, FlatRange range, TopkParams topk)
    : TensorChunker(std::move(tensors), chunk_bytes, codec, topk) {
  if (range.begin < 0 || range.end < range.begin || range.end > remaining_) {
    throw std::out_of_range(
        absl::StrCat("chunk range [", range.begin, ", ", range.end, ") outside the ", remaining_, " elements"));
  }
  int64_t skip = range.begin;
  while (index_ < tensors_.size() && skip >= numel_[index_]) skip -= numel_[index_++];
  offset_ = skip;
  remaining_ = range.size();
}

TensorChunker::TensorChunker(std::vector<TensorChunk> encoded)
    : chunk_bytes_(kMinChunkBytes), codec_(CODEC_RAW), encoded_(std::move(encoded)), replay_(true) {}

bool TensorChunker::Next(TensorChunk* out) { return Next(out, nullptr); }

bool TensorChunker::Next(TensorChunk* out, std::string_view* raw_payload) {
  if (replay_) {
    if (raw_payload != nullptr) *raw_payload = std::string_view();
    if (next_encoded_ >= encoded_.size()) return false;
    *out = encoded_[next_encoded_++];
    bytes_emitted_ += static_cast<int64_t>(out->data().size());
    return true;
  }
  while (index_ < tensors_.size() && offset_ >= numel_[index_]) {
    ++index_;
    offset_ = 0;
  }
  if (index_ >= tensors_.size() || remaining_ == 0) return false;
  const auto& [name, t] = tensors_[index_];
  Codec codec = t.scalar_type() == at::kFloat ? codec_ : CODEC_RAW;
  int64_t elements = codec == CODEC_TOPK ? TopkChunkElements(chunk_bytes_, topk_)
                                         : ChunkElements(codec, chunk_bytes_, t.element_size());
  if (codec == CODEC_TOPK && offset_ % topk_.chunk != 0) {
    // A range that starts inside a block of the tensor (a cluster rank's slice, comm.cluster_parts): the elements up
    // to the block's end go raw, so that every topk chunk starts a block, as receivers require.
    codec = CODEC_RAW;
    elements = topk_.chunk - offset_ % topk_.chunk;
  }
  const int64_t count = std::min({elements, numel_[index_] - offset_, remaining_});
  out->Clear();
  out->set_name(name);
  out->set_dtype(ToWireDType(t.scalar_type()).value());
  for (int64_t d : shape_[index_]) out->add_shape(d);
  const int64_t local = offset_ - origin_[index_];  // where the chunk starts in t
  out->set_offset(offset_);
  out->set_count(count);
  if (raw_payload != nullptr && codec == CODEC_RAW && t.is_cpu()) {
    out->set_codec(CODEC_RAW);
    const char* base = static_cast<const char*>(t.data_ptr()) + local * t.element_size();
    *raw_payload = std::string_view(base, static_cast<size_t>(count * t.element_size()));
  } else if (codec == CODEC_TOPK) {
    EncodeTopk(t.view({-1}).narrow(0, local, count), topk_, out);
    if (raw_payload != nullptr) *raw_payload = std::string_view();
  } else {
    EncodeValues(t.view({-1}).narrow(0, local, count), codec, out);
    if (raw_payload != nullptr) *raw_payload = std::string_view();
  }
  offset_ += count;
  remaining_ -= count;
  bytes_emitted_ +=
      static_cast<int64_t>(raw_payload != nullptr && !raw_payload->empty() ? raw_payload->size() : out->data().size());
  return true;
}

ChunkStreamReader::ChunkStreamReader(std::vector<TensorSpec> specs) : specs_(std::move(specs)) {
  for (const TensorSpec& spec : specs_) remaining_ += spec.numel();
  SkipEmpty();  // zero-element tensors carry no chunk
}

ChunkStreamReader::ChunkStreamReader(std::vector<TensorSpec> specs, FlatRange range)
    : ChunkStreamReader(std::move(specs)) {
  if (range.begin < 0 || range.end < range.begin || range.end > remaining_) {
    throw std::out_of_range(
        absl::StrCat("chunk range [", range.begin, ", ", range.end, ") outside the ", remaining_, " elements"));
  }
  index_ = 0;
  int64_t skip = range.begin;
  while (index_ < specs_.size() && skip >= specs_[index_].numel()) skip -= specs_[index_++].numel();
  offset_ = skip;
  remaining_ = range.size();
}

void ChunkStreamReader::SkipEmpty() {
  while (index_ < specs_.size() && offset_ == specs_[index_].numel()) {
    offset_ = 0;
    ++index_;
  }
}

std::string ChunkStreamReader::Position() const {
  if (Done()) return absl::StrCat("end of stream (", specs_.size(), " tensors)");
  if (index_ >= specs_.size()) return "end of the tensors";
  return absl::StrCat("tensor ", index_ + 1, "/", specs_.size(), " '", specs_[index_].name, "' at element ", offset_);
}

absl::Status ChunkStreamReader::CheckNext(const TensorChunk& chunk) const {
  if (Done()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected chunk '", Truncated(chunk.name()), "' after the last tensor (or past the range)"));
  }
  const TensorSpec& spec = specs_[index_];
  if (chunk.name() != spec.name) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", Position(), ", got a chunk of '", Truncated(chunk.name()), "'"));
  }
  auto dtype = FromWireDType(chunk.dtype());
  if (!dtype.ok()) return dtype.status();
  if (*dtype != spec.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name, "': dtype ", c10::toString(*dtype),
                                                   ", expected ", c10::toString(spec.dtype)));
  }
  if (std::vector<int64_t>(chunk.shape().begin(), chunk.shape().end()) != spec.shape) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name, "': shape ", ShapeForMessage(chunk.shape()),
                                                   ", expected [", absl::StrJoin(spec.shape, ","), "]"));
  }
  if (chunk.offset() != offset_) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", spec.name, "': chunk at element ", chunk.offset(), ", expected ", offset_));
  }
  const int64_t remaining = std::min(spec.numel() - offset_, remaining_);
  if (chunk.count() <= 0 || chunk.count() > remaining) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name, "': chunk of ", chunk.count(),
                                                   " elements at ", offset_, ", only ", remaining,
                                                   " remain (of the tensor, or of the stream's range)"));
  }
  return absl::OkStatus();
}

void ChunkStreamReader::Advance(int64_t count) {
  last_index_ = index_;
  last_offset_ = offset_;
  offset_ += count;
  remaining_ -= count;
  SkipEmpty();
}

absl::StatusOr<at::Tensor> ChunkStreamReader::Next(const TensorChunk& chunk) {
  if (absl::Status s = CheckNext(chunk); !s.ok()) return s;
  auto values = DecodeValues(chunk, specs_[index_].dtype);
  if (!values.ok()) return values.status();
  Advance(chunk.count());
  return values;
}

absl::StatusOr<SparseChunk> ChunkStreamReader::NextSparse(const TensorChunk& chunk) {
  if (absl::Status s = CheckNext(chunk); !s.ok()) return s;
  if ((chunk.codec() != CODEC_TOPK && chunk.codec() != CODEC_UPDATE) || specs_[index_].dtype != at::kFloat) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", specs_[index_].name, "': a sparse chunk must be a topk chunk of a float32 tensor"));
  }
  auto sparse = chunk.codec() == CODEC_UPDATE ? DecodeUpdate(chunk) : DecodeTopk(chunk);
  if (!sparse.ok()) return sparse.status();
  Advance(chunk.count());
  return sparse;
}

ChunkAssembler::ChunkAssembler(NamedTensors dest) : dest_(std::move(dest)), reader_(SpecsOf(dest_)) {}

absl::Status ChunkAssembler::Accept(const TensorChunk& chunk) {
  auto view = reader_.Next(chunk);
  if (!view.ok()) return view.status();
  at::Tensor flat = dest_[reader_.tensor_index()].second.view({-1});
  flat.narrow(0, reader_.chunk_offset(), view->numel()).copy_(*view);
  return absl::OkStatus();
}

}  // namespace diloco
