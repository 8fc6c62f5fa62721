#include "coordinator/pull_payload.h"

#include <google/protobuf/io/coded_stream.h>

#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/diloco.pb.h"

namespace diloco {
namespace {

using google::protobuf::io::CodedOutputStream;

constexpr uint8_t kPullMessageChunkTag = (2 << 3) | 2;  // PullMessage.chunk = 2, length-delimited
constexpr uint8_t kTensorChunkDataTag = (7 << 3) | 2;   // TensorChunk.data = 7, length-delimited

void AppendVarint(std::string* out, uint64_t v) {
  uint8_t buf[10];
  const uint8_t* end = CodedOutputStream::WriteVarint64ToArray(v, buf);
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(end - buf));
}

// The bytes of PullMessage{chunk: `fields` + data} up to the data itself (which follows them on the wire): `fields`
// is the chunk without its data, serialized; the data field is written last, which protobuf parsers accept.
std::string RawPrefix(const TensorChunk& fields, size_t data_bytes) {
  const std::string head = fields.SerializeAsString();
  const uint64_t chunk_bytes = head.size() + 1 + CodedOutputStream::VarintSize64(data_bytes) + data_bytes;
  std::string out;
  out.push_back(static_cast<char>(kPullMessageChunkTag));
  AppendVarint(&out, chunk_bytes);
  out += head;
  out.push_back(static_cast<char>(kTensorChunkDataTag));
  AppendVarint(&out, data_bytes);
  return out;
}

// A slice over theta's memory that keeps the snapshot (and so the tensors) alive until gRPC drops it.
void ReleaseSnapshot(void* keep) { delete static_cast<std::shared_ptr<const ParamSnapshot>*>(keep); }
// A slice over a sparse update's message that keeps the update alive until gRPC drops it.
void ReleaseUpdate(void* keep) { delete static_cast<std::shared_ptr<const SparseUpdate>*>(keep); }

}  // namespace

PullPayload::PullPayload(std::shared_ptr<const ParamSnapshot> snapshot, NamedTensors tensors, int64_t chunk_bytes,
                         Codec codec, std::optional<FlatRange> range)
    : key_(snapshot.get()),
      round_(snapshot->round),
      writes_(snapshot->writes),
      guard_(snapshot->guard),
      snapshot_(std::move(snapshot)),
      chunker_(range ? std::make_unique<TensorChunker>(std::move(tensors), chunk_bytes, codec, *range)
                     : std::make_unique<TensorChunker>(std::move(tensors), chunk_bytes, codec)) {}

PullPayload::PullPayload(const std::shared_ptr<const ParamSnapshot>& snapshot,
                         std::shared_ptr<const SparseUpdate> update)
    : key_(snapshot.get()), round_(snapshot->round), writes_(snapshot->writes), guard_(snapshot->guard) {
  absl::MutexLock lock(&mu_);
  exhausted_ = true;
  for (size_t i = 0; i < update->messages.size(); ++i) {
    const std::string& message = update->messages[i];
    Entry e;
    e.head = grpc::Slice(const_cast<char*>(message.data()), message.size(), &ReleaseUpdate,
                         new std::shared_ptr<const SparseUpdate>(update));
    e.payload_bytes = update->payload_bytes[i];
    entries_.push_back(std::move(e));
  }
}

absl::Status PullPayload::BuildUpTo(size_t i) {
  TensorChunk chunk;
  while (entries_.size() <= i && !exhausted_) {
    std::string_view raw;
    bool more = false;
    // Encoding reads theta: under the guard. A raw chunk only takes a pointer; its bytes are read by gRPC later
    // (see the header's "Torn reads").
    TensorChunker* chunker = chunker_.get();  // (the lambda runs here, under mu_)
    if (!ReadIfAtRound(guard_.get(), round_, writes_, [&] { more = chunker->Next(&chunk, &raw); })) {
      return absl::UnavailableError(
          absl::StrCat("the global parameters moved on from round ", round_, " while this pull streamed; pull again"));
    }
    if (!more) {
      exhausted_ = true;
      bool any_raw = false;
      for (const Entry& e : entries_) any_raw = any_raw || e.raw != nullptr;
      if (!any_raw) {  // every message is its own bytes: theta may go (Lifetime)
        chunker_.reset();
        snapshot_.reset();
      }
      break;
    }
    Entry e;
    if (!raw.empty()) {
      e.head = grpc::Slice(RawPrefix(chunk, raw.size()));
      e.raw = raw.data();
      e.raw_bytes = raw.size();
      e.payload_bytes = static_cast<int64_t>(raw.size());
    } else {
      e.payload_bytes = static_cast<int64_t>(chunk.data().size());
      PullMessage message;
      message.mutable_chunk()->Swap(&chunk);
      e.head = grpc::Slice(message.SerializeAsString());
    }
    entries_.push_back(std::move(e));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> PullPayload::Message(size_t i, grpc::ByteBuffer* out, int64_t* payload_bytes, bool* raw) {
  absl::MutexLock lock(&mu_);
  absl::Status built = BuildUpTo(i);
  if (!built.ok()) return built;
  if (i >= entries_.size()) return false;
  const Entry& e = entries_[i];
  *payload_bytes = e.payload_bytes;
  *raw = e.raw != nullptr;
  if (e.raw == nullptr) {
    *out = grpc::ByteBuffer(&e.head, 1);
    return true;
  }
  const grpc::Slice slices[2] = {e.head, grpc::Slice(const_cast<char*>(e.raw), e.raw_bytes, &ReleaseSnapshot,
                                                     new std::shared_ptr<const ParamSnapshot>(snapshot_))};
  *out = grpc::ByteBuffer(slices, 2);
  return true;
}

bool PullPayload::Current() const {
  return ReadIfAtRound(guard_.get(), round_, writes_, [] {});
}

std::shared_ptr<PullPayload> PullPayloadCache::Get(const std::shared_ptr<const ParamSnapshot>& snapshot, int fragment,
                                                   NamedTensors tensors, std::optional<FlatRange> range) {
  absl::MutexLock lock(&mu_);
  Newest& newest = newest_[{fragment, range ? range->begin : -1, range ? range->end : -1}];
  std::shared_ptr<PullPayload> shared = newest.shared.lock();
  if (shared != nullptr && shared->Of(*snapshot)) return shared;
  auto payload = std::make_shared<PullPayload>(snapshot, std::move(tensors), chunk_bytes_, codec_, range);
  if (shared == nullptr || shared->round() <= snapshot->round) {
    newest.shared = payload;
    newest.kept = codec_ == CODEC_RAW ? nullptr : payload;
  }
  return payload;
}

}  // namespace diloco
