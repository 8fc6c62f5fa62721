// SerialExecutor (coordinator/serial_executor.h): tasks run in order on one thread; Stop lets the running task
// finish, calls the waiting ones (and later posts) with run = false, and joins.
#include "coordinator/serial_executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

namespace diloco {
namespace {

TEST(SerialExecutorTest, RunsTasksInOrderOnOneOtherThread) {
  SerialExecutor executor;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  std::promise<void> done;
  for (int i = 0; i < 20; ++i) {
    executor.Post([&, i](bool run) {
      EXPECT_TRUE(run);
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
      if (i == 19) done.set_value();
    });
  }
  done.get_future().wait();
  ASSERT_EQ(order.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(order[i], i);
  for (const auto& id : threads) {
    EXPECT_EQ(id, threads[0]);
    EXPECT_NE(id, std::this_thread::get_id());
  }
}

TEST(SerialExecutorTest, StopFinishesTheRunningTaskAndRefusesTheRest) {
  SerialExecutor executor;
  std::promise<void> entered, release;
  std::atomic<bool> first_finished{false};
  std::atomic<int> refused{0}, ran{0};
  executor.Post([&](bool run) {
    EXPECT_TRUE(run);
    entered.set_value();
    release.get_future().wait();
    first_finished = true;
  });
  executor.Post([&](bool run) { run ? ++ran : ++refused; });
  entered.get_future().wait();
  std::thread stopper([&] { executor.Stop(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  release.set_value();
  stopper.join();  // returns only after the running task finished
  EXPECT_TRUE(first_finished.load());
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(refused.load(), 1);
  executor.Post([&](bool run) { run ? ++ran : ++refused; });  // after Stop: refused at once, on this thread
  EXPECT_EQ(refused.load(), 2);
  executor.Stop();  // idempotent
}

TEST(SerialExecutorTest, AnExceptionDoesNotEndTheThread) {
  SerialExecutor executor;
  std::promise<void> done;
  executor.Post([](bool) { throw std::runtime_error("disk full"); });
  executor.Post([&](bool run) {
    EXPECT_TRUE(run);
    done.set_value();
  });
  done.get_future().wait();
}

}  // namespace
}  // namespace diloco
