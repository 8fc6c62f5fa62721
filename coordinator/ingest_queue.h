// IngestQueue: the coordinator's ingest threads, so that gRPC reactors only move bytes. A push stream's reactor posts
// each received message, as a piece of work, to its Lane; the queue's threads run the work (PushSession: decoding,
// the NaN/Inf check, the fold into the round accumulator under the core's mutex), so no gRPC callback thread ever
// waits on the fold and a Heartbeat or GetStatus is never queued behind a push.
//
// Order: the items of one lane run one at a time, in the order posted (a push stream is one lane, and its
// PushSession is not thread-safe); items of different lanes run concurrently on the queue's threads, round-robin one
// item per turn, so one big push does not starve the others.
//
// Bound (back-pressure): the queue counts the bytes and the messages waiting (posted, not yet started). A reactor
// asks HasRoom() after posting and issues its next read only when there is room, else the lane's next item resumes
// the reads once there is (service.cc); a blocking reader (the TCP listener's connection thread) calls WaitForRoom().
// Room: the lane holds fewer than max_lane_messages waiting items and the
// whole queue fewer than max_bytes waiting bytes, or the lane has nothing waiting at all (so every stream can always
// make progress, and no lane waits on another). So the waiting bytes stay under max_bytes plus one message per open
// stream, plus the items being run (at most one per thread), never an unbounded buffer.
//
// Ownership: owns its threads and the items waiting; lanes are shared (the reactor and the queue while the lane has
// work). The destructor runs every item still waiting, then joins the threads; a Post after that runs the item at
// once on the caller's thread. Thread-safety: all methods are thread-safe; the work items run on the queue's threads
// with no lock of the queue held, and an exception from one is logged and dropped.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace diloco {

class IngestQueue {
 public:
  // The defaults won the A/B of scripts/bench/results/ingest_latency.md against (2 threads, 4, 32 MiB) and
  // (1 thread, 2, 8 MiB): a short queue also keeps the waiting chunks in the CPU's cache until they are folded.
  struct Options {
    int threads = 2;                       // the fold itself is under the core's mutex: more threads add little
    int64_t max_bytes = int64_t{8} << 20;  // waiting bytes of all lanes together
    int max_lane_messages = 2;             // waiting items of one lane
  };

  class Lane;

  explicit IngestQueue(Options options);
  IngestQueue() : IngestQueue(Options()) {}
  ~IngestQueue();
  IngestQueue(const IngestQueue&) = delete;
  IngestQueue& operator=(const IngestQueue&) = delete;

  // A new lane (one per push stream).
  std::shared_ptr<Lane> NewLane();

  // Bytes and items waiting (posted, not yet started), for tests and logs.
  int64_t waiting_bytes() const;
  int64_t waiting_items() const;
  // Blocks until nothing is waiting or running (for tests).
  void WaitIdle();

 private:
  struct Item {
    int64_t bytes = 0;
    std::function<void()> work;
  };
  void Post(const std::shared_ptr<Lane>& lane, int64_t bytes, std::function<void()> work) ABSL_LOCKS_EXCLUDED(mu_);
  bool HasRoom(const Lane& lane) const ABSL_LOCKS_EXCLUDED(mu_);
  bool HasRoomLocked(const Lane& lane) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WaitForRoom(const Lane& lane) ABSL_LOCKS_EXCLUDED(mu_);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until an item is ready: takes it (its lane in *lane) and returns true; false once stopping and nothing
  // is waiting.
  bool TakeNext(std::shared_ptr<Lane>* lane, Item* item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Lane>> ready_ ABSL_GUARDED_BY(mu_);  // lanes with waiting items and none running
  int64_t waiting_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waiting_items_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // items being run
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int live_threads_ ABSL_GUARDED_BY(mu_) = 0;  // threads not yet returned from Loop()
  std::vector<std::thread> threads_;           // set by the constructor, joined by the destructor
};

// One stream's FIFO of work items. Made by IngestQueue::NewLane; must not outlive its queue.
class IngestQueue::Lane : public std::enable_shared_from_this<IngestQueue::Lane> {
 public:
  explicit Lane(IngestQueue* queue) : queue_(queue) {}

  // Queues `work`, which holds `bytes` of received data, to run after every item posted to this lane before it.
  void Post(int64_t bytes, std::function<void()> work) { queue_->Post(shared_from_this(), bytes, std::move(work)); }
  // Whether the stream may read its next message now (see the header comment).
  bool HasRoom() const { return queue_->HasRoom(*this); }
  // Blocks until HasRoom() would be true (for a reader on a thread of its own).
  void WaitForRoom() const { queue_->WaitForRoom(*this); }

 private:
  friend class IngestQueue;
  IngestQueue* const queue_;
  // Guarded by queue_->mu_ and touched only by IngestQueue's methods, which hold it (the analysis cannot tell that
  // queue_->mu_ is their mu_, so these two carry no annotation).
  std::deque<Item> items_;  // waiting
  bool scheduled_ = false;  // in ready_ or running
};

}  // namespace diloco
