// IngestQueue (ingest_queue.h): lanes of work items run in order per lane on the queue's own threads.
#include "coordinator/ingest_queue.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>

namespace diloco {

IngestQueue::IngestQueue(Options options) : options_(options) {
  const int n = std::max(1, options_.threads);
  {
    absl::MutexLock lock(&mu_);
    live_threads_ = n;
  }
  threads_.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
}

IngestQueue::~IngestQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();  // Loop() returns once nothing is waiting
}

std::shared_ptr<IngestQueue::Lane> IngestQueue::NewLane() { return std::make_shared<Lane>(this); }

void IngestQueue::Post(const std::shared_ptr<Lane>& lane, int64_t bytes, std::function<void()> work) {
  {
    absl::MutexLock lock(&mu_);
    if (live_threads_ > 0) {
      lane->items_.push_back({bytes, std::move(work)});
      waiting_bytes_ += bytes;
      ++waiting_items_;
      if (!lane->scheduled_) {
        lane->scheduled_ = true;
        ready_.push_back(lane);
      }
      return;
    }
  }
  work();  // the threads are gone (after the destructor began): run it here
}

bool IngestQueue::HasRoomLocked(const Lane& lane) const {
  if (lane.items_.empty()) return true;
  return static_cast<int>(lane.items_.size()) < options_.max_lane_messages && waiting_bytes_ < options_.max_bytes;
}

bool IngestQueue::HasRoom(const Lane& lane) const {
  absl::MutexLock lock(&mu_);
  return HasRoomLocked(lane);
}

void IngestQueue::WaitForRoom(const Lane& lane) {
  absl::MutexLock lock(&mu_);
  auto room = [this, &lane]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return HasRoomLocked(lane); };
  mu_.Await(absl::Condition(&room));
}

int64_t IngestQueue::waiting_bytes() const {
  absl::MutexLock lock(&mu_);
  return waiting_bytes_;
}

int64_t IngestQueue::waiting_items() const {
  absl::MutexLock lock(&mu_);
  return waiting_items_;
}

void IngestQueue::WaitIdle() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiting_items_ == 0 && running_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

bool IngestQueue::TakeNext(std::shared_ptr<Lane>* lane, Item* item) {
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !ready_.empty(); };
  mu_.Await(absl::Condition(&ready));
  if (ready_.empty()) {  // stopping, and every item has run
    --live_threads_;
    return false;
  }
  *lane = std::move(ready_.front());
  ready_.pop_front();
  *item = std::move((*lane)->items_.front());
  (*lane)->items_.pop_front();
  waiting_bytes_ -= item->bytes;
  --waiting_items_;
  ++running_;
  return true;
}

void IngestQueue::Loop() {
  for (;;) {
    std::shared_ptr<Lane> lane;
    Item item;
    {
      absl::MutexLock lock(&mu_);
      if (!TakeNext(&lane, &item)) return;
    }
    try {
      item.work();
    } catch (const std::exception& e) {  // never let an exception end an ingest thread
      spdlog::error("ingest item failed: {}", e.what());
    } catch (...) {
      spdlog::error("ingest item failed");
    }
    item.work = nullptr;  // releases what it holds (the message) outside the lock
    absl::MutexLock lock(&mu_);
    --running_;
    if (lane->items_.empty()) {
      lane->scheduled_ = false;
    } else {
      ready_.push_back(std::move(lane));  // round-robin: one item per turn
    }
  }
}

}  // namespace diloco
