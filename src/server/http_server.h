// The OpenAI-compatible HTTP server: routes, authentication, and its lifecycle (loading,
// ready, draining).
//
// Each connection is served by one thread of a fixed pool (cpp-httplib's blocking model); a
// streaming response holds its thread until the stream ends, so the pool is sized above the
// number of streams expected at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "server/api_keys.h"
#include "server/chat_template.h"
#include "server/openai_protocol.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace kvc::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  size_t max_body_bytes = size_t{4} << 20;
  int http_threads = 96;  // connections served at once, streaming ones included
  // Without keys every caller is the tenant "anonymous", with admin rights: there is no one
  // to tell apart, and whoever can reach the port can already use the whole server.
  std::optional<ApiKeys> api_keys;
};

// What the server serves once the model is loaded. The engine must outlive the server.
struct Backend {
  engine::Engine* engine = nullptr;
  ChatTemplate chat_template{ChatFormat::kChatml};
  std::string model_id;  // the name /v1/models lists and responses carry
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
  // listener and joins every connection thread. Idempotent.
  void shutdown(double drain_seconds);
  // The bound port (after start()).
  int port() const { return port_; }

 private:
  enum class State { kLoading, kReady, kDraining, kStopped };
  class InFlight;
  friend class InFlight;

  void routes();
  // Runs a handler, turning exceptions into OpenAI-shaped error responses.
  void guarded(const httplib::Request& req, httplib::Response& res,
               const std::function<void()>& handler);
  // The caller's tenant from its bearer key; throws 401 without a valid key, and 403 when
  // admin is needed and the key is not an admin key.
  Tenant authenticate(const httplib::Request& req, bool need_admin) const;
  // The backend, or throws 503 while loading.
  const Backend& backend() const;
  void check_body(const httplib::Request& req) const;
  // The namespace of a tenant's requests (with an optional cache_salt), remembered for the
  // per-tenant metrics.
  kv::Hash256 namespace_of(const std::string& tenant, const std::string& cache_salt);
  // Tokens of a prompt-or-messages body (tokenize, explain, pin); param names the field.
  std::vector<int32_t> prompt_tokens(const nlohmann::json& body, bool add_special,
                                     const std::string& what);

  void health(httplib::Response& res) const;
  void models(httplib::Response& res) const;
  void completions(const httplib::Request& req, httplib::Response& res, bool chat);
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);
  void metrics(const httplib::Request& req, httplib::Response& res);
  void cache_stats(const httplib::Request& req, httplib::Response& res);
  void cache_explain(const httplib::Request& req, httplib::Response& res);
  void cache_pin(const httplib::Request& req, httplib::Response& res);
  void cache_flush(const httplib::Request& req, httplib::Response& res);

  void count_response(int status);

  ServerOptions options_;
  std::unique_ptr<httplib::Server> svr_;
  std::thread thread_;
  int port_ = 0;
  const int64_t started_at_;  // Unix seconds, for /v1/models' "created"
  std::atomic<State> state_{State::kLoading};
  std::optional<Backend> backend_;  // written once, before state_ becomes kReady
  std::mutex shutdown_mu_;

  std::mutex tenants_mu_;
  std::map<std::string, std::set<kv::Hash256>> tenant_namespaces_;

  std::mutex responses_mu_;
  std::map<int, uint64_t> responses_;

  // Generations whose responses are still being written, so that shutdown waits for them.
  std::mutex flight_mu_;
  std::condition_variable flight_cv_;
  size_t in_flight_ = 0;
};

}  // namespace kvc::server
