// PullPayload: one snapshot of theta (or one fragment of it) as the wire messages of PullParameters, built once and
// shared by every pull of that snapshot, so that a round's parameters are encoded once per pull codec and no pull
// copies or encodes them again (issue 18, "pulls served once").
// - Raw chunks (fp32, comm.pull_codec raw) are never copied: each message is a small serialized prefix (the
//   PullMessage and TensorChunk fields up to the data's length) followed by a slice that points into theta's own
//   memory and keeps the snapshot alive. Protobuf parses it as the TensorChunker's message (fields may come in any
//   order), so a client sees the same bytes it always did.
// - Encoded chunks (bf16, int8, int4) are encoded the first time any pull reaches them, under the snapshot's guard,
//   and kept as immutable serialized messages for the payload's lifetime: comm.pull_codec bf16 keeps half a copy of
//   theta while its payload is cached (int8 a quarter, int4 an eighth), the one extra buffer this design needs.
// Torn reads: synchronous rounds write theta_{t+1} over theta_t in place (theta_store.h, ThetaGuard), and gRPC reads a
// raw message's bytes when it writes them to the socket, after Message() returned. So a raw message must be written
// with write-through (RawMessage() says which: the write completes only once the socket has the bytes) and the pull
// must check Current() after each write completes: if theta moved on meanwhile, the bytes may be torn and the pull
// ends with UNAVAILABLE (the worker pulls again), as a pull that found theta moved on always did.
// Lifetime: a payload holds its snapshot (so that asynchronous rounds do not recycle the tensors it reads) until every
// message is built, then only if a message points into theta; each raw slice holds the snapshot too, until gRPC
// drops it. PullPayloadCache shares the newest payload per fragment between pulls: with an encoding pull codec it
// keeps it (its encoded bytes are what is worth sharing) until a newer snapshot's pull replaces it; with raw pulls it
// only shares it between pulls in flight (nothing is encoded, and keeping it would keep an old theta alive in
// asynchronous rounds). A pull of an older snapshot than the newest gets a payload of its own.
// Thread-safety: both classes may be used from any thread at once (each under its own mutex).
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/sparse_pull.h"
#include "coordinator/theta_store.h"
#include "proto/codec.h"
#include "proto/tensor_chunks.h"

namespace diloco {

class PullPayload {
 public:
  // `tensors`: the snapshot's tensors to send (all of them, or one fragment's), contiguous float32 on the CPU.
  // range: only those elements of the tensors flattened end to end (a pull in parts, PROTOCOL.md); within bounds.
  PullPayload(std::shared_ptr<const ParamSnapshot> snapshot, NamedTensors tensors, int64_t chunk_bytes, Codec codec,
              std::optional<FlatRange> range = std::nullopt);

  // A payload of messages built beforehand (a sparse pull's update, sparse_pull.h: its serialized PullMessages), of
  // `snapshot`'s round (Current() follows its guard as for theta's own messages). The slices point into the
  // update's own bytes and keep it alive: the pulls released together by the round's close copy nothing (before,
  // each copied the whole update, W pulls at once W copies of up to 1/8 of theta).
  PullPayload(const std::shared_ptr<const ParamSnapshot>& snapshot, std::shared_ptr<const SparseUpdate> update);

  int64_t round() const { return round_; }
  // Whether this is the payload of `snapshot` (the same object, at the same round).
  bool Of(const ParamSnapshot& snapshot) const {
    return key_ == &snapshot && round_ == snapshot.round && writes_ == snapshot.writes;
  }

  // Message i (0-based) of the stream after the header, serialized as a PullMessage holding one TensorChunk, with
  // its payload size (for the byte counters) and whether it points into theta's memory (*raw: write it with
  // write-through). False when the stream has fewer messages. UNAVAILABLE when message i had to be encoded and theta
  // has moved on from the snapshot's round.
  absl::StatusOr<bool> Message(size_t i, grpc::ByteBuffer* out, int64_t* payload_bytes, bool* raw);
  // Whether theta still holds the snapshot's round (always true for an immutable snapshot). Blocks while an outer
  // step is writing theta (ReadIfAtRound, theta_store.h).
  bool Current() const;

 private:
  struct Entry {
    grpc::Slice head;           // the whole message, or the prefix of a raw one
    const char* raw = nullptr;  // a raw message's data in theta's memory
    size_t raw_bytes = 0;
    int64_t payload_bytes = 0;
  };
  // Builds entries up to index i (inclusive) where the chunker has them. mu_ held.
  absl::Status BuildUpTo(size_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const void* const key_;  // the snapshot's address (compared only, never followed)
  const int64_t round_;
  const int64_t writes_;                     // the snapshot's ThetaGuard writes (theta_store.h)
  const std::shared_ptr<ThetaGuard> guard_;  // null: the snapshot is immutable
  // The snapshot's tensors, while messages remain to be built or some point into them (Lifetime); null after.
  mutable absl::Mutex mu_;
  std::shared_ptr<const ParamSnapshot> snapshot_ ABSL_GUARDED_BY(mu_);
  // Null once every message is built and none points into theta (raw pointers may point into a contiguous copy it
  // made).
  std::unique_ptr<TensorChunker> chunker_ ABSL_GUARDED_BY(mu_);
  bool exhausted_ ABSL_GUARDED_BY(mu_) = false;  // every message is built
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

class PullPayloadCache {
 public:
  PullPayloadCache(int64_t chunk_bytes, Codec codec) : chunk_bytes_(chunk_bytes), codec_(codec) {}

  // The payload of `snapshot`'s tensors in `fragment` (-1: all; else fragment_members' positions, given by the
  // caller in `tensors`), shared with every other pull of the same snapshot and fragment while it is the newest.
  // With a range, only those elements (a pull in parts), shared with the pulls of the same range.
  std::shared_ptr<PullPayload> Get(const std::shared_ptr<const ParamSnapshot>& snapshot, int fragment,
                                   NamedTensors tensors, std::optional<FlatRange> range = std::nullopt);

 private:
  const int64_t chunk_bytes_;
  const Codec codec_;
  absl::Mutex mu_;
  struct Newest {
    std::weak_ptr<PullPayload> shared;
    std::shared_ptr<PullPayload> kept;  // encoding codecs only
  };
  // By fragment and range ({-1, -1}: the whole fragment).
  std::map<std::tuple<int, int64_t, int64_t>, Newest> newest_ ABSL_GUARDED_BY(mu_);
};

}  // namespace diloco
