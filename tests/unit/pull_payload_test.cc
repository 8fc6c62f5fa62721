// A snapshot's shared pull messages (coordinator/pull_payload.h): raw messages parse as the TensorChunker's and point
// into theta, encoded ones are encoded once and shared, a guard that moved on is noticed, the cache shares the
// newest payload and an encoded payload lets its snapshot go once built.
#include "coordinator/pull_payload.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace diloco {
namespace {

std::shared_ptr<ParamSnapshot> Snapshot(int64_t round, std::shared_ptr<ThetaGuard> guard = nullptr) {
  auto s = std::make_shared<ParamSnapshot>();
  s->round = round;
  s->params = {{"emb.weight", at::randn({33, 7})}, {"head.bias", at::randn({1000})}, {"scale", at::randn({})}};
  s->guard = std::move(guard);
  return s;
}

// The bytes of a ByteBuffer and its slices.
std::string Bytes(const grpc::ByteBuffer& buffer, std::vector<grpc::Slice>* slices) {
  EXPECT_TRUE(buffer.Dump(slices).ok());
  std::string out;
  for (const grpc::Slice& s : *slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// Every message of `payload` equals what a TensorChunker with the same settings produces, wrapped in a PullMessage.
void ExpectSameAsChunker(PullPayload& payload, const NamedTensors& tensors, int64_t chunk_bytes, Codec codec,
                         bool expect_raw) {
  TensorChunker chunker(tensors, chunk_bytes, codec);
  PullMessage expected;
  size_t i = 0;
  for (; chunker.Next(expected.mutable_chunk()); ++i) {
    grpc::ByteBuffer buffer;
    int64_t payload_bytes = 0;
    bool raw = !expect_raw;
    absl::StatusOr<bool> more = payload.Message(i, &buffer, &payload_bytes, &raw);
    ASSERT_TRUE(more.ok()) << more.status();
    ASSERT_TRUE(*more) << "message " << i;
    std::vector<grpc::Slice> slices;
    PullMessage got;
    ASSERT_TRUE(got.ParseFromString(Bytes(buffer, &slices))) << "message " << i;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, expected)) << "message " << i;
    EXPECT_EQ(payload_bytes, static_cast<int64_t>(expected.chunk().data().size()));
    EXPECT_EQ(raw, expect_raw);
    if (expect_raw) {  // the data slice is theta's own memory, not a copy
      ASSERT_EQ(slices.size(), 2u);
      const auto& [name, t] = *std::find_if(tensors.begin(), tensors.end(),
                                            [&](const auto& p) { return p.first == expected.chunk().name(); });
      EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()),
                static_cast<const char*>(t.data_ptr()) + expected.chunk().offset() * 4);
    }
  }
  grpc::ByteBuffer buffer;
  int64_t bytes = 0;
  bool raw_flag = false;
  absl::StatusOr<bool> more = payload.Message(i, &buffer, &bytes, &raw_flag);
  ASSERT_TRUE(more.ok());
  EXPECT_FALSE(*more) << "the payload has more messages than the chunker";
}

TEST(PullPayloadTest, RawMessagesAreTheChunkersMessagesPointingIntoTheta) {
  auto snapshot = Snapshot(3);
  PullPayload payload(snapshot, snapshot->params, 256, CODEC_RAW);
  ExpectSameAsChunker(payload, snapshot->params, 256, CODEC_RAW, /*expect_raw=*/true);
}

TEST(PullPayloadTest, EncodedMessagesAreTheChunkersAndEncodedOnce) {
  for (Codec codec : {CODEC_BF16, CODEC_INT8, CODEC_INT4}) {
    auto snapshot = Snapshot(3);
    PullPayload payload(snapshot, snapshot->params, 256, codec);
    ExpectSameAsChunker(payload, snapshot->params, 256, codec, /*expect_raw=*/false);
    // A second pull gets the very bytes of the first (no second encoding).
    grpc::ByteBuffer first, second;
    int64_t bytes = 0;
    bool raw_flag = false;
    ASSERT_TRUE(*payload.Message(1, &first, &bytes, &raw_flag));
    ASSERT_TRUE(*payload.Message(1, &second, &bytes, &raw_flag));
    std::vector<grpc::Slice> a, b;
    ASSERT_TRUE(first.Dump(&a).ok() && second.Dump(&b).ok());
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(b.size(), 1u);
    EXPECT_EQ(a[0].begin(), b[0].begin()) << Codec_Name(codec);
  }
}

TEST(PullPayloadTest, ThetaMovingOnIsNoticed) {
  auto guard = std::make_shared<ThetaGuard>();
  {
    absl::MutexLock lock(&guard->mu);
    guard->round = 5;
  }
  auto snapshot = Snapshot(5, guard);
  PullPayload encoded(snapshot, snapshot->params, 256, CODEC_INT8);
  PullPayload raw(snapshot, snapshot->params, 256, CODEC_RAW);
  grpc::ByteBuffer buffer;
  int64_t bytes = 0;
  bool raw_flag = false;
  ASSERT_TRUE(*encoded.Message(0, &buffer, &bytes, &raw_flag));
  ASSERT_TRUE(*raw.Message(0, &buffer, &bytes, &raw_flag));
  EXPECT_TRUE(encoded.Current());
  EXPECT_TRUE(raw.Current());
  {
    absl::MutexLock lock(&guard->mu);
    guard->round = 6;  // the outer step wrote theta_6 over theta_5
  }
  EXPECT_FALSE(raw.Current());
  EXPECT_FALSE(encoded.Current());
  absl::StatusOr<bool> next = encoded.Message(1, &buffer, &bytes, &raw_flag);
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(*encoded.Message(0, &buffer, &bytes, &raw_flag)) << "built messages stay (the reactor checks Current())";
}

TEST(PullPayloadTest, CacheSharesTheNewestSnapshotsPayload) {
  PullPayloadCache cache(256, CODEC_INT8);
  auto s3 = Snapshot(3), s4 = Snapshot(4);
  std::shared_ptr<PullPayload> a = cache.Get(s3, -1, s3->params);
  EXPECT_EQ(cache.Get(s3, -1, s3->params), a);
  EXPECT_NE(cache.Get(s3, 0, s3->params), a) << "fragments have payloads of their own";
  std::shared_ptr<PullPayload> b = cache.Get(s4, -1, s4->params);
  EXPECT_NE(b, a);
  EXPECT_EQ(b->round(), 4);
  EXPECT_NE(cache.Get(s3, -1, s3->params), b) << "an older snapshot gets its own";
  EXPECT_EQ(cache.Get(s4, -1, s4->params), b) << "and does not displace the newest";
  const PullPayload* kept = b.get();
  b.reset();
  EXPECT_EQ(cache.Get(s4, -1, s4->params).get(), kept) << "an encoding codec's payload is kept between pulls";

  PullPayloadCache raw(256, CODEC_RAW);
  std::shared_ptr<PullPayload> r = raw.Get(s4, -1, s4->params);
  EXPECT_EQ(raw.Get(s4, -1, s4->params), r) << "shared while a pull holds it";
  std::weak_ptr<PullPayload> gone = r;
  r.reset();
  EXPECT_TRUE(gone.expired()) << "a raw payload is not kept: it would keep an old theta alive";
}

TEST(PullPayloadTest, AnEncodedPayloadLetsItsSnapshotGoOnceBuilt) {
  auto snapshot = Snapshot(2);
  std::weak_ptr<const ParamSnapshot> watch = snapshot;
  PullPayload payload(snapshot, snapshot->params, 256, CODEC_BF16);
  snapshot.reset();
  ASSERT_FALSE(watch.expired()) << "held while messages remain to be encoded";
  grpc::ByteBuffer buffer;
  int64_t bytes = 0;
  bool raw_flag = false;
  for (size_t i = 0; *payload.Message(i, &buffer, &bytes, &raw_flag); ++i) {
  }
  EXPECT_TRUE(watch.expired()) << "every message is its own bytes: theta may be recycled";
}

}  // namespace
}  // namespace diloco
