// HttpStatusServer: the coordinator's optional HTTP listener (config key coordinator.metrics_listen). Serves
//   GET /metrics      Prometheus text (coordinator/metrics_text.h)
//   GET /status.json  the StatusReply as JSON (proto/status_json.h, the shape of `diloco-ctl status --json`)
//   GET /             a self-contained HTML status page that polls /status.json (coordinator/status_page.h)
// (HEAD too), 404 for any other path and 405 for other methods. It owns the listening socket, a cpp-httplib server
// and the thread that runs it (httplib answers requests on its own worker threads). It never touches coordinator
// state itself: each request calls the injected StatusSource, which must be thread-safe (main passes
// CoordinatorCore::Status(), which locks the core's mutex for the copy). Start/Stop/destructor are called from one
// thread; address()/port() are const.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "proto/diloco.pb.h"

namespace httplib {
class Server;
}

namespace diloco {

class HttpStatusServer {
 public:
  using StatusSource = std::function<StatusReply()>;

  // Binds `listen` (HOST:PORT; port 0 picks a free one; [::1]:PORT for IPv6) and starts serving. On failure the
  // error is one line naming the address and the config key coordinator.metrics_listen.
  static absl::StatusOr<std::unique_ptr<HttpStatusServer>> Start(const std::string& listen, StatusSource source);
  ~HttpStatusServer();  // Stop()

  // Stops accepting, finishes the requests in flight and joins the thread. Idempotent.
  void Stop();

  int port() const { return port_; }
  // HOST:PORT actually bound (the port resolved when 0 was asked for).
  const std::string& address() const { return address_; }

 private:
  HttpStatusServer(StatusSource source);
  void Route();

  StatusSource source_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};
  int port_ = 0;
  std::string address_;
};

}  // namespace diloco
