// IngestQueue (ingest_queue.h): lanes of work items run in order per lane on the queue's own threads.
#include "coordinator/ingest_queue.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>

namespace diloco {

IngestQueue::IngestQueue(Options options) : options_(options) {
  const int n = std::max(1, options_.threads);
  live_threads_ = n;
  threads_.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
}

IngestQueue::~IngestQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();  // Loop() returns once nothing is waiting
}

std::shared_ptr<IngestQueue::Lane> IngestQueue::NewLane() { return std::make_shared<Lane>(this); }

void IngestQueue::Post(const std::shared_ptr<Lane>& lane, int64_t bytes, std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (live_threads_ > 0) {
      lane->items_.push_back({bytes, std::move(work)});
      waiting_bytes_ += bytes;
      ++waiting_items_;
      if (!lane->scheduled_) {
        lane->scheduled_ = true;
        ready_.push_back(lane);
        work_cv_.notify_one();
      }
      return;
    }
  }
  work();  // the threads are gone (after the destructor began): run it here
}

bool IngestQueue::HasRoom(const Lane& lane) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (lane.items_.empty()) return true;
  return static_cast<int>(lane.items_.size()) < options_.max_lane_messages && waiting_bytes_ < options_.max_bytes;
}

int64_t IngestQueue::waiting_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_bytes_;
}

int64_t IngestQueue::waiting_items() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_items_;
}

void IngestQueue::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return waiting_items_ == 0 && running_ == 0; });
}

void IngestQueue::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stopping_ || !ready_.empty(); });
    if (ready_.empty()) {  // stopping, and every item has run
      --live_threads_;
      return;
    }
    std::shared_ptr<Lane> lane = std::move(ready_.front());
    ready_.pop_front();
    Item item = std::move(lane->items_.front());
    lane->items_.pop_front();
    waiting_bytes_ -= item.bytes;
    --waiting_items_;
    ++running_;
    lock.unlock();
    try {
      item.work();
    } catch (const std::exception& e) {  // never let an exception end an ingest thread
      spdlog::error("ingest item failed: {}", e.what());
    } catch (...) {
      spdlog::error("ingest item failed");
    }
    item.work = nullptr;  // releases what it holds (the message) outside the lock
    lock.lock();
    --running_;
    if (lane->items_.empty()) {
      lane->scheduled_ = false;
    } else {
      ready_.push_back(std::move(lane));  // round-robin: one item per turn
      work_cv_.notify_one();
    }
    if (waiting_items_ == 0 && running_ == 0) idle_cv_.notify_all();
  }
}

}  // namespace diloco
