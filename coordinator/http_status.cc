#include "coordinator/http_status.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <exception>

#include "absl/strings/str_cat.h"
#include "coordinator/metrics_text.h"
#include "coordinator/status_page.h"
#include "proto/status_json.h"

namespace diloco {
namespace {

absl::Status ListenError(const std::string& listen, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("coordinator.metrics_listen: cannot listen on '", listen, "' (", why,
                                                 "; use HOST:PORT, port 0 picks a free one, \"\" turns it off)"));
}

}  // namespace

HttpStatusServer::HttpStatusServer(StatusSource source)
    : source_(std::move(source)), server_(std::make_unique<httplib::Server>()) {}

HttpStatusServer::~HttpStatusServer() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpStatusServer>> HttpStatusServer::Start(const std::string& listen,
                                                                          StatusSource source) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size() ||
      listen.find_first_not_of("0123456789", colon + 1) != std::string::npos || listen.size() - colon > 6) {
    return ListenError(listen, "not HOST:PORT");
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const int wanted = std::stoi(listen.substr(colon + 1));
  if (wanted > 65535) return ListenError(listen, "port above 65535");

  std::unique_ptr<HttpStatusServer> s(new HttpStatusServer(std::move(source)));
  s->Route();
  int port = -1;
  if (wanted == 0) {
    port = s->server_->bind_to_any_port(host);
  } else if (s->server_->bind_to_port(host, wanted)) {
    port = wanted;
  }
  if (port <= 0) return ListenError(listen, "address in use, not an address of this machine, or not permitted");
  s->port_ = port;
  s->address_ = absl::StrCat(listen.substr(0, colon), ":", port);
  HttpStatusServer* raw = s.get();
  s->thread_ = std::thread([raw] {
    raw->server_->listen_after_bind();
    raw->listen_returned_ = true;
  });
  // Stop() is only reliable once httplib's accept loop runs (before that, stop() is a no-op).
  for (int i = 0; i < 500 && !s->server_->is_running() && !s->listen_returned_; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return s;
}

void HttpStatusServer::Route() {
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_content(MetricsText(source_()), kPrometheusContentType);
  });
  server_->Get(R"(/status\.json)", [this](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_content(StatusToJson(source_()).dump(), "application/json");
  });
  server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(StatusPageHtml(), "text/html; charset=utf-8");
  });
  // Read-only: other methods get 405 on every path (httplib would answer 400).
  const httplib::Server::Handler read_only = [](const httplib::Request&, httplib::Response& res) {
    res.status = 405;
    res.set_header("Allow", "GET, HEAD");
    res.set_content("method not allowed: this server only answers GET\n", "text/plain");
  };
  server_->Post(".*", read_only);
  server_->Put(".*", read_only);
  server_->Patch(".*", read_only);
  server_->Delete(".*", read_only);
  server_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 404) {
      res.set_content(absl::StrCat("not found: ", req.path, " (this server has /, /metrics and /status.json)\n"),
                      "text/plain");
    }
  });
  server_->set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    spdlog::warn("http {}: {}", req.path, what);
    res.status = 500;
    res.set_content("internal error: " + what + "\n", "text/plain");
  });
}

void HttpStatusServer::Stop() {
  if (!thread_.joinable()) return;
  // stop() closes the listening socket once the accept loop runs; repeat until listen_after_bind has returned.
  while (!listen_returned_) {
    server_->stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  thread_.join();
}

}  // namespace diloco
