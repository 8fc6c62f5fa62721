#include "worker/tokenizer/parallel_encoder.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

namespace diloco::tokenize {
namespace {

// The state the reader, the encoders and the consumer share; every field is guarded by mu.
struct Pipeline {
  std::mutex mu;
  std::condition_variable changed;
  std::deque<WorkItem> to_encode;
  std::map<uint64_t, EncodedItem> encoded;  // by seq, waiting for their turn
  size_t in_flight = 0;                     // read and not yet consumed
  uint64_t items_read = 0;
  bool reading_done = false;
  bool stop = false;
  std::string read_error;
};

void ReadLoop(const std::vector<InputRange>& ranges, SplitPosition start, uint64_t item_bytes, size_t max_in_flight,
              Pipeline* p) {
  ItemReader reader(ranges, start, item_bytes);
  while (true) {
    {
      std::unique_lock<std::mutex> lock(p->mu);
      p->changed.wait(lock, [&] { return p->stop || p->in_flight < max_in_flight; });
      if (p->stop) return;
    }
    WorkItem item;
    const bool got = reader.Next(&item);
    std::lock_guard<std::mutex> lock(p->mu);
    if (!got) {
      p->reading_done = true;
      p->read_error = reader.error();
      p->changed.notify_all();
      return;
    }
    ++p->in_flight;
    ++p->items_read;
    p->to_encode.push_back(std::move(item));
    p->changed.notify_all();
  }
}

void EncodeLoop(const std::vector<InputRange>& ranges, const DocumentEncoder& encoder, Pipeline* p) {
  while (true) {
    WorkItem item;
    {
      std::unique_lock<std::mutex> lock(p->mu);
      p->changed.wait(lock, [&] { return p->stop || !p->to_encode.empty() || p->reading_done; });
      if (p->stop || p->to_encode.empty()) return;
      item = std::move(p->to_encode.front());
      p->to_encode.pop_front();
    }
    EncodedItem out;
    encoder.Encode(item, ranges[item.range].path, &out);
    std::lock_guard<std::mutex> lock(p->mu);
    p->encoded.emplace(out.seq, std::move(out));
    p->changed.notify_all();
  }
}

}  // namespace

std::string EncodeInOrder(const std::vector<InputRange>& ranges, SplitPosition start, uint64_t item_bytes,
                          const DocumentEncoder& encoder, int threads,
                          const std::function<bool(EncodedItem&)>& consume) {
  Pipeline p;
  const size_t max_in_flight = 2 * static_cast<size_t>(threads) + 2;
  std::vector<std::thread> workers;
  workers.emplace_back(ReadLoop, std::cref(ranges), start, item_bytes, max_in_flight, &p);
  for (int i = 0; i < threads; ++i) workers.emplace_back(EncodeLoop, std::cref(ranges), std::cref(encoder), &p);
  std::string error;
  for (uint64_t next = 0;; ++next) {
    EncodedItem item;
    {
      std::unique_lock<std::mutex> lock(p.mu);
      p.changed.wait(lock, [&] { return p.encoded.count(next) > 0 || (p.reading_done && p.items_read == next); });
      if (p.encoded.count(next) == 0) {
        error = p.read_error;
        break;
      }
      item = std::move(p.encoded.at(next));
      p.encoded.erase(next);
      --p.in_flight;
      p.changed.notify_all();
    }
    if (!item.error.empty()) {
      error = item.error;
      break;
    }
    if (!consume(item)) {
      error = item.error;  // consume may report why it stopped
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(p.mu);
    p.stop = true;
    p.changed.notify_all();
  }
  for (std::thread& t : workers) t.join();
  return error;
}

}  // namespace diloco::tokenize
