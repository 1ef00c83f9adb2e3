// The OpenAI-compatible HTTP server: routes, authentication, and its lifecycle (loading,
// ready, draining). The pieces it routes to live in their own files: the connection layer
// (http_transport), tenants, the request mapping, the choice accumulator and SSE writer, and
// the cache endpoints.
//
// Thread-safety: start(), set_ready() and shutdown() are for the owning thread (shutdown is
// idempotent and may also run from the destructor). Handlers run on connection threads; the
// state they share (lifecycle state, response counters, in-flight count) is atomic or guarded
// by its own mutex, and the backend is written once before the state becomes ready.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "base/mutex.h"
#include "engine/engine.h"
#include "server/api_error.h"
#include "server/api_keys.h"
#include "server/backend.h"
#include "server/chat_template.h"
#include "server/http_transport.h"
#include "server/openai_protocol.h"
#include "server/tenant.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace kvc::server {

class CacheEndpoints;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  size_t max_body_bytes = size_t{4} << 20;
  // Timeouts and connection caps (see http_transport.h).
  TransportOptions transport;
  // Without keys every caller is the tenant "anonymous", with admin rights: there is no one
  // to tell apart, and whoever can reach the port can already use the whole server.
  std::optional<ApiKeys> api_keys;
};

// What a shutdown did, for the log.
struct DrainReport {
  uint64_t completed = 0;  // requests that ended normally while draining
  uint64_t cancelled = 0;  // requests cancelled (at the deadline, or by their client)
  double seconds = 0;      // from the call to the listener closing
};

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  // Shuts down without draining if still running.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port and serves on a background thread; returns the bound port. Until
  // set_ready(), /health answers 503 and every other endpoint 503. Throws Error when the
  // address cannot be bound.
  int start();
  // Serves the API from backend from now on.
  void set_ready(Backend backend);
  // Stops taking new work (new requests get 503 and connections close), lets in-flight
  // requests and streams finish for up to drain_seconds (the engine then cancels the rest,
  // and their streams end with an error event and [DONE]), shuts the engine down, closes the
  // listener and joins every connection thread, all within drain_seconds and one engine step.
  // Idempotent (a second call reports nothing).
  DrainReport shutdown(double drain_seconds);
  // The bound port (after start()).
  int port() const { return port_; }
  // The connection layer's counts.
  ConnectionCounts connections() const { return svr_->counts(); }

 private:
  enum class State { kLoading, kReady, kDraining, kStopped };
  class InFlight;
  friend class InFlight;
  using Body = std::string;

  void routes();
  // A GET (and HEAD) route.
  void get(const std::string& path,
           std::function<void(const httplib::Request&, httplib::Response&)> fn);
  // A POST route whose handler gets the body, read whatever its content type.
  void post(const std::string& path,
            std::function<void(const httplib::Request&, httplib::Response&, const Body&)> fn);
  // The error for a request no route took: 405 (with an Allow header set on res) when its path
  // is a route's, 404 otherwise.
  ApiError not_routed(const httplib::Request& req, httplib::Response& res) const;
  // Runs a handler, turning exceptions into OpenAI-shaped error responses.
  void guarded(const httplib::Request& req, httplib::Response& res,
               const std::function<void()>& handler);
  Tenant authenticate(const httplib::Request& req, bool need_admin) const;
  // The backend, or throws 503 while loading.
  const Backend& backend() const;

  void health(httplib::Response& res) const;
  void models(httplib::Response& res) const;
  void completions(const httplib::Request& req, httplib::Response& res, const Body& body,
                   bool chat);
  void tokenize(const httplib::Request& req, httplib::Response& res, const Body& body);
  void detokenize(const httplib::Request& req, httplib::Response& res, const Body& body);
  void apply_template(const httplib::Request& req, httplib::Response& res, const Body& body);
  void metrics(const httplib::Request& req, httplib::Response& res);

  void count_response(int status);

  ServerOptions options_;
  std::unique_ptr<HttpTransport> svr_;
  // Each route's path and the methods it takes ("GET, HEAD" or "POST"); written by routes().
  std::map<std::string, std::string> allowed_methods_;
  std::thread thread_;
  int port_ = 0;
  const int64_t started_at_;  // Unix seconds, for /v1/models' "created"
  std::atomic<State> state_{State::kLoading};
  std::optional<Backend> backend_;         // written once, before state_ becomes kReady
  std::unique_ptr<CacheEndpoints> cache_;  // likewise
  Tenants tenants_;
  Mutex shutdown_mu_;  // one shutdown at a time

  Mutex responses_mu_;
  std::map<int, uint64_t> responses_ GUARDED_BY(responses_mu_);

  // Generations whose responses are still being written, so that shutdown waits for them.
  Mutex flight_mu_;
  CondVar flight_cv_;
  size_t in_flight_ GUARDED_BY(flight_mu_) = 0;
};

}  // namespace kvc::server
