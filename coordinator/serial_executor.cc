// SerialExecutor (serial_executor.h): one joined thread running tasks in order.
#include "coordinator/serial_executor.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <utility>

namespace diloco {

SerialExecutor::SerialExecutor() : thread_([this] { Loop(); }) {}

SerialExecutor::~SerialExecutor() { Stop(); }

void SerialExecutor::Post(Task task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      waiting_.push_back(std::move(task));
      return;
    }
  }
  task(false);
}

void SerialExecutor::Stop() {
  std::deque<Task> refused;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    refused.swap(waiting_);
  }
  for (Task& task : refused) task(false);
  if (thread_.joinable()) thread_.join();  // after the running task, if any
}

void SerialExecutor::Loop() {
  for (;;) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !waiting_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (waiting_.empty()) return;  // stopping
      task = std::move(waiting_.front());
      waiting_.pop_front();
    }
    try {
      task(true);
    } catch (const std::exception& e) {  // a task answers its own errors; never let one end the thread
      spdlog::error("serial executor task failed: {}", e.what());
    }
  }
}

}  // namespace diloco
