// IngestQueue (coordinator/ingest_queue.h): per-lane order, one item of a lane at a time, the room rule
// (back-pressure) and the destructor running what is still waiting.
#include "coordinator/ingest_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

namespace diloco {
namespace {

// Blocks the queue's only thread until released, so that the test sees items waiting.
class Gate {
 public:
  void Hold(IngestQueue::Lane& lane) {
    lane.Post(0, [this] {
      entered_.set_value();
      released_.get_future().wait();
    });
    entered_.get_future().wait();
  }
  void Release() { released_.set_value(); }

 private:
  std::promise<void> entered_, released_;
};

TEST(IngestQueueTest, RunsEachLaneInOrderOneItemAtATime) {
  IngestQueue queue({/*threads=*/2, /*max_bytes=*/1 << 20, /*max_lane_messages=*/4});
  constexpr int kLanes = 4, kItems = 500;
  std::vector<std::shared_ptr<IngestQueue::Lane>> lanes;
  std::vector<std::vector<int>> seen(kLanes);
  std::vector<std::atomic<int>> running(kLanes);
  std::atomic<int> overlaps{0};
  for (auto& r : running) r = 0;
  for (int l = 0; l < kLanes; ++l) lanes.push_back(queue.NewLane());
  for (int i = 0; i < kItems; ++i) {
    for (int l = 0; l < kLanes; ++l) {
      lanes[l]->Post(1, [&, l, i] {
        if (running[l].fetch_add(1) != 0) ++overlaps;
        seen[l].push_back(i);  // unsynchronized on purpose: a lane's items never overlap
        running[l].fetch_sub(1);
      });
    }
  }
  queue.WaitIdle();
  EXPECT_EQ(overlaps.load(), 0);
  for (int l = 0; l < kLanes; ++l) {
    ASSERT_EQ(seen[l].size(), static_cast<size_t>(kItems)) << "lane " << l;
    for (int i = 0; i < kItems; ++i) ASSERT_EQ(seen[l][i], i) << "lane " << l;
  }
  EXPECT_EQ(queue.waiting_bytes(), 0);
  EXPECT_EQ(queue.waiting_items(), 0);
}

TEST(IngestQueueTest, RoomIsBoundedPerLaneAndInBytes) {
  IngestQueue queue({/*threads=*/1, /*max_bytes=*/100, /*max_lane_messages=*/3});
  auto gate_lane = queue.NewLane();
  auto a = queue.NewLane();
  auto b = queue.NewLane();
  Gate gate;
  gate.Hold(*gate_lane);  // the only thread is busy from here on
  std::atomic<int> ran{0};
  auto count = [&] { ++ran; };

  // Per lane: room while fewer than 3 items wait.
  a->Post(10, count);
  EXPECT_TRUE(a->HasRoom());
  a->Post(10, count);
  EXPECT_TRUE(a->HasRoom());
  a->Post(10, count);
  EXPECT_FALSE(a->HasRoom());  // 3 waiting
  EXPECT_EQ(queue.waiting_items(), 3);
  EXPECT_EQ(queue.waiting_bytes(), 30);

  // In bytes: a lane with items waiting has no room once the queue holds max_bytes...
  b->Post(70, count);
  EXPECT_EQ(queue.waiting_bytes(), 100);
  EXPECT_FALSE(b->HasRoom());
  // ... but a lane with nothing waiting always has (one message per stream beyond the bound).
  auto c = queue.NewLane();
  EXPECT_TRUE(c->HasRoom());
  EXPECT_EQ(ran.load(), 0);

  gate.Release();
  queue.WaitIdle();
  EXPECT_EQ(ran.load(), 4);
  EXPECT_EQ(queue.waiting_bytes(), 0);
  EXPECT_TRUE(a->HasRoom());
  EXPECT_TRUE(b->HasRoom());
}

TEST(IngestQueueTest, AnItemNoLongerCountsAsWaitingOnceItRuns) {
  // A reactor's paused read is resumed by the lane's next item: by then that item's bytes no longer count.
  IngestQueue queue({/*threads=*/1, /*max_bytes=*/100, /*max_lane_messages=*/2});
  auto gate_lane = queue.NewLane();
  auto lane = queue.NewLane();
  Gate gate;
  gate.Hold(*gate_lane);
  std::promise<bool> room;
  lane->Post(500, [&] { room.set_value(lane->HasRoom()); });  // runs while the next one (10 bytes) waits
  lane->Post(10, [] {});
  EXPECT_FALSE(lane->HasRoom());  // 2 items, 510 bytes waiting
  gate.Release();
  EXPECT_TRUE(room.get_future().get());
  queue.WaitIdle();
}

TEST(IngestQueueTest, DestructorRunsWhatIsWaiting) {
  std::atomic<int> ran{0};
  Gate gate;
  {
    IngestQueue queue({/*threads=*/1, /*max_bytes=*/1 << 20, /*max_lane_messages=*/4});
    auto held = queue.NewLane();
    auto lane = queue.NewLane();
    gate.Hold(*held);
    for (int i = 0; i < 5; ++i) lane->Post(1, [&] { ++ran; });
    EXPECT_EQ(ran.load(), 0);
    gate.Release();
  }
  EXPECT_EQ(ran.load(), 5);
}

// A blocking reader (the TCP listener's connection thread) waits in WaitForRoom until the lane's items run.
TEST(IngestQueueTest, WaitForRoomReturnsOnceTheLaneHasRoomAgain) {
  IngestQueue queue({/*threads=*/1, /*max_bytes=*/1 << 20, /*max_lane_messages=*/2});
  Gate gate;
  auto held = queue.NewLane();
  auto lane = queue.NewLane();
  gate.Hold(*held);
  lane->Post(1, [] {});
  lane->Post(1, [] {});
  ASSERT_FALSE(lane->HasRoom());
  std::atomic<bool> returned{false};
  std::thread reader([&] {
    lane->WaitForRoom();
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned.load());  // still full: the only thread is held
  gate.Release();
  reader.join();
  EXPECT_TRUE(returned.load());
  EXPECT_TRUE(lane->HasRoom());
  queue.WaitIdle();
}

TEST(IngestQueueTest, AnExceptionDoesNotStopTheQueue) {
  IngestQueue queue({/*threads=*/1, /*max_bytes=*/1 << 20, /*max_lane_messages=*/4});
  auto lane = queue.NewLane();
  std::atomic<int> ran{0};
  lane->Post(1, [] { throw std::runtime_error("bad chunk"); });
  lane->Post(1, [&] { ++ran; });
  queue.WaitIdle();
  EXPECT_EQ(ran.load(), 1);
}

}  // namespace
}  // namespace diloco
