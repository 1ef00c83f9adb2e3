#include "server/http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "base/error.h"
#include "server/api_error.h"
#include "server/cache_endpoints.h"
#include "server/choice_accumulator.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "server/request_mapping.h"
#include "server/sse_writer.h"

namespace kvc::server {

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void send_json(httplib::Response& res, int status, const nlohmann::json& j) {
  res.status = status;
  res.set_content(dump_json(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status(), e.to_json());
  // Overload clears as running requests finish: clients should come back soon, not at once.
  if (e.status() == 429) res.set_header("Retry-After", "1");
  if (e.status() == 503) res.set_header("Retry-After", "5");
}

// A request body, read whatever its Content-Type says (clients such as `curl -d` send JSON
// as a form), up to max bytes.
std::string read_body(const httplib::Request& req, httplib::Response& res,
                      const httplib::ContentReader& reader, size_t max) {
  // Without Content-Length or chunked framing a request has no body (RFC 9112 6.3).
  if (!req.has_header("Content-Length") && !req.has_header("Transfer-Encoding")) {
    HttpTransport::request_read();
    return {};
  }
  if (req.is_multipart_form_data()) {
    HttpTransport::close_after_response();
    throw ApiError(400, "invalid_request_error",
                   "the request body must be JSON, not multipart/form-data");
  }
  std::string body;
  bool too_large = false;
  const bool ok = reader([&](const char* data, size_t n) {
    if (body.size() + n > max) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (!ok) {
    // Whatever is left of the body would be read as the next request.
    HttpTransport::close_after_response();
    if (HttpTransport::request_timed_out()) {
      throw ApiError(408, "invalid_request_error", HttpTransport::timeout_description(), "",
                     "request_timeout");
    }
    if (too_large || res.status == 413) throw error_for_status(413, req.method, req.path, max);
    throw ApiError(400, "invalid_request_error", "the request body could not be read");
  }
  HttpTransport::request_read();
  return body;
}

}  // namespace

// Counts a generation as in flight for as long as it lives.
class HttpServer::InFlight {
 public:
  explicit InFlight(HttpServer& server) : server_(server) {
    MutexLock lock(server_.flight_mu_);
    ++server_.in_flight_;
  }
  ~InFlight() {
    {
      MutexLock lock(server_.flight_mu_);
      --server_.in_flight_;
    }
    server_.flight_cv_.notify_all();
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  HttpServer& server_;
};

HttpServer::HttpServer(ServerOptions options)
    : options_(std::move(options)),
      svr_(std::make_unique<HttpTransport>(options_.transport)),
      started_at_(unix_now()),
      tenants_(options_.api_keys) {
  svr_->set_payload_max_length(options_.max_body_bytes);
  // Tokens go out one small chunk at a time: Nagle's algorithm would hold them back.
  svr_->set_tcp_nodelay(true);
  svr_->set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        // A request that came too slowly: cpp-httplib saw only a failed read.
        if (HttpTransport::request_timed_out() && res.status != 408) {
          HttpTransport::close_after_response();
          send_error(res, ApiError(408, "invalid_request_error",
                                   HttpTransport::timeout_description(), "", "request_timeout"));
          return httplib::Server::HandlerResponse::Handled;
        }
        // Statuses that no handler wrote a body for: unknown routes (or known ones asked with
        // another method), oversized bodies, malformed HTTP. Handlers' own errors already carry
        // their body.
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        send_error(res, res.status == 404 ? not_routed(req, res)
                                          : error_for_status(res.status, req.method, req.path,
                                                             options_.max_body_bytes));
        return httplib::Server::HandlerResponse::Handled;
      }));
  svr_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, ApiError(500, "server_error", what));
      });
  svr_->set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    // cpp-httplib reads bodies of POST, PUT, PATCH and DELETE only: another request's body
    // would be read as the next request, so the connection closes after it.
    const bool reads_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
                            req.method == "DELETE";
    if (!reads_body &&
        (std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10) > 0 ||
         req.has_header("Transfer-Encoding"))) {
      HttpTransport::close_after_response();
      res.set_header("Connection", "close");
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Counted before the response is written (every response passes here, routed or not), so
  // that a client that has its answer also finds it counted in /metrics.
  svr_->set_post_routing_handler(
      [this](const httplib::Request&, httplib::Response& res) { count_response(res.status); });
  svr_->set_logger([](const httplib::Request& req, const httplib::Response& res) {
    spdlog::debug("{} {} -> {}", req.method, req.path, res.status);
  });
  routes();
}

HttpServer::~HttpServer() {
  shutdown(0);
}

void HttpServer::get(const std::string& path,
                     std::function<void(const httplib::Request&, httplib::Response&)> fn) {
  // cpp-httplib answers HEAD through the GET handlers.
  allowed_methods_[path] = "GET, HEAD";
  svr_->Get(path, std::move(fn));
}

void HttpServer::post(
    const std::string& path,
    std::function<void(const httplib::Request&, httplib::Response&, const Body&)> fn) {
  allowed_methods_[path] = "POST";
  svr_->Post(path, [this, fn = std::move(fn)](const httplib::Request& req, httplib::Response& res,
                                              const httplib::ContentReader& reader) {
    guarded(req, res, [&] {
      const Body body = read_body(req, res, reader, options_.max_body_bytes);
      fn(req, res, body);
    });
  });
}

void HttpServer::routes() {
  using Req = httplib::Request;
  using Res = httplib::Response;
  get("/health", [this](const Req& req, Res& res) { guarded(req, res, [&] { health(res); }); });
  get("/v1/models", [this](const Req& req, Res& res) {
    guarded(req, res, [&] {
      authenticate(req, false);
      models(res);
    });
  });
  post("/v1/completions",
       [this](const Req& req, Res& res, const Body& b) { completions(req, res, b, false); });
  post("/v1/chat/completions",
       [this](const Req& req, Res& res, const Body& b) { completions(req, res, b, true); });
  post("/tokenize", [this](const Req& req, Res& res, const Body& b) { tokenize(req, res, b); });
  post("/detokenize", [this](const Req& req, Res& res, const Body& b) { detokenize(req, res, b); });
  post("/apply-template",
       [this](const Req& req, Res& res, const Body& b) { apply_template(req, res, b); });
  get("/metrics",
      [this](const Req& req, Res& res) { guarded(req, res, [&] { metrics(req, res); }); });
  get("/v1/cache", [this](const Req& req, Res& res) {
    guarded(req, res, [&] {
      const Tenant tenant = authenticate(req, false);
      backend();
      send_json(res, 200, cache_->stats(tenant));
    });
  });
  post("/v1/cache/explain", [this](const Req& req, Res& res, const Body& b) {
    const Tenant tenant = authenticate(req, false);
    backend();
    send_json(res, 200, cache_->explain(tenant, parse_json_object(b)));
  });
  post("/v1/cache/pin", [this](const Req& req, Res& res, const Body& b) {
    const Tenant tenant = authenticate(req, true);
    backend();
    InFlight flight(*this);
    send_json(res, 200, cache_->pin(tenant, parse_json_object(b)));
  });
  post("/v1/cache/flush", [this](const Req& req, Res& res, const Body& b) {
    authenticate(req, true);
    backend();
    send_json(res, 200, cache_->flush(b));
  });
  // Any other POST: its body is read (so the connection stays in step) and it gets 404, or
  // 405 on a GET path. Registered last, and not as a path of its own.
  svr_->Post(".*", [this](const Req& req, Res& res, const httplib::ContentReader& reader) {
    guarded(req, res, [&] {
      read_body(req, res, reader, options_.max_body_bytes);
      throw not_routed(req, res);
    });
  });
}

ApiError HttpServer::not_routed(const httplib::Request& req, httplib::Response& res) const {
  const auto it = allowed_methods_.find(req.path);
  if (it == allowed_methods_.end()) {
    return error_for_status(404, req.method, req.path, options_.max_body_bytes);
  }
  // As FastAPI (vLLM) answers: 405 with the methods the path takes.
  res.set_header("Allow", it->second);
  return method_not_allowed(req.method, req.path, it->second);
}

int HttpServer::start() {
  if (options_.port == 0) {
    port_ = svr_->bind_to_any_port(options_.host);
  } else {
    port_ = svr_->bind_to_port(options_.host, options_.port) ? options_.port : -1;
  }
  if (port_ <= 0) {
    fail("cannot listen on {}:{} (address in use, or not an address of this machine)",
         options_.host, options_.port);
  }
  thread_ = std::thread([this] { svr_->listen_with_backlog(); });
  // cpp-httplib 0.11 has no wait_until_ready(): its accept loop flags itself running.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!svr_->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return port_;
}

void HttpServer::set_ready(Backend backend) {
  backend_ = std::move(backend);
  cache_ = std::make_unique<CacheEndpoints>(*backend_, tenants_);
  state_ = State::kReady;
}

DrainReport HttpServer::shutdown(double drain_seconds) {
  MutexLock lock(shutdown_mu_);
  DrainReport report;
  if (state_ == State::kStopped) return report;
  if (!thread_.joinable()) {
    state_ = State::kStopped;
    return report;
  }
  const auto start = std::chrono::steady_clock::now();
  state_ = State::kDraining;
  // Idle keep-alive connections close now, the others after their current response.
  svr_->stop_connections();
  // In the tokenizer-only mode there is no engine: no generation can be in flight.
  const bool generating = backend_ && backend_->generates();
  engine::EngineStats before;
  if (generating) {
    before = backend_->engine().stats();
    // The engine refuses new requests from here on, and returns once its requests finished
    // or, at the deadline, were cancelled.
    backend_->engine().shutdown(drain_seconds * 1000.0);
  }
  {
    // What remains is writing the last chunks of each response: every generation has ended.
    MutexLock flight(flight_mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (in_flight_ > 0 && flight_cv_.wait_until(flight, deadline)) {
    }
  }
  state_ = State::kStopped;
  // Only now: cpp-httplib ends every open stream as soon as the listener stops.
  svr_->stop();
  thread_.join();
  if (generating) {
    const engine::EngineStats after = backend_->engine().stats();
    report.cancelled = after.cancelled - before.cancelled;
    report.completed = (after.finished - before.finished) - report.cancelled;
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

void HttpServer::guarded(const httplib::Request& req, httplib::Response& res,
                         const std::function<void()>& handler) {
  try {
    handler();
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const engine::RequestError& e) {
    send_error(res, api_error_for(e));
  } catch (const std::exception& e) {
    spdlog::error("{} {}: {}", req.method, req.path, e.what());
    send_error(res, ApiError(500, "server_error", e.what()));
  }
  if (state_ != State::kReady && state_ != State::kLoading) {
    res.set_header("Connection", "close");
    HttpTransport::close_after_response();
  }
}

Tenant HttpServer::authenticate(const httplib::Request& req, bool need_admin) const {
  return tenants_.authenticate(req.get_header_value("Authorization"), need_admin);
}

const Backend& HttpServer::backend() const {
  switch (state_.load()) {
    case State::kLoading:
      throw ApiError(503, "server_error", "the model is loading; retry when /health answers 200",
                     "", "loading");
    case State::kStopped:
      throw ApiError(503, "server_error", "the server is shutting down", "", "shutting_down");
    case State::kReady:
    case State::kDraining:
      break;
  }
  return *backend_;
}

void HttpServer::health(httplib::Response& res) const {
  switch (state_.load()) {
    case State::kLoading:
      send_error(res, ApiError(503, "server_error", "the model is loading", "", "loading"));
      return;
    case State::kReady:
      send_json(res, 200, {{"status", "ok"}});
      return;
    case State::kDraining:
    case State::kStopped:
      send_error(res,
                 ApiError(503, "server_error", "the server is shutting down", "", "shutting_down"));
      return;
  }
}

void HttpServer::models(httplib::Response& res) const {
  const Backend& b = backend();
  nlohmann::json data = nlohmann::json::array();
  for (const auto& name : b.model_names()) {
    data.push_back({{"id", name},
                    {"object", "model"},
                    {"created", started_at_},
                    {"owned_by", "kvcache"},
                    {"root", b.model_id},
                    {"max_model_len", b.context_length()}});
  }
  send_json(res, 200, {{"object", "list"}, {"data", data}});
}

void HttpServer::completions(const httplib::Request& req, httplib::Response& res, const Body& body,
                             bool chat) {
  const Tenant tenant = authenticate(req, false);
  const Backend& b = backend();
  engine::Engine& engine = b.engine();
  const CompletionRequest r = parse_completion_request(body, chat);
  ResponseShape shape;
  shape.model = resolve_model(b, r.model);
  std::vector<engine::Request> requests =
      map_completion(r, b, tenant.name, tenants_.namespace_of(engine, tenant.name, r.cache_salt));

  auto flight = std::make_shared<InFlight>(*this);
  auto gen = std::make_shared<Generation>(engine, std::move(requests));
  shape.chat = chat;
  shape.id = new_response_id(chat ? "chatcmpl-" : "cmpl-");
  shape.created = unix_now();
  shape.samples_per_prompt = static_cast<size_t>(r.n);
  shape.logprobs = r.logprobs;
  shape.top_logprobs = r.top_logprobs;
  shape.include_usage = r.include_usage;
  auto acc = std::make_shared<ChoiceAccumulator>(gen, shape, engine.tokenizer());

  if (r.stream) {
    auto writer = std::make_shared<SseWriter>(acc);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [writer](size_t, httplib::DataSink& sink) { return writer->step(sink); },
        // Runs when the response ends, however it ends: a client that went away before the
        // stream finished cancels its requests, which frees their blocks within one step.
        [gen, flight](bool) { gen->cancel(); });
    return;
  }
  // Nothing is written until the whole response is ready, so the connection is watched
  // instead: a client that went away cancels its requests, as a stream's does.
  constexpr auto kCheckEvery = std::chrono::milliseconds(100);
  auto next_check = std::chrono::steady_clock::now();
  Generation::Event e;
  while (!gen->done()) {
    if (gen->next(e, kCheckEvery)) acc->add(e);
    const auto now = std::chrono::steady_clock::now();
    if (now < next_check) continue;
    next_check = now + kCheckEvery;
    if (HttpTransport::client_gone()) {
      gen->cancel();
      HttpTransport::close_after_response();
      // nginx's status for a client that closed its request: no one reads it, /metrics counts it.
      send_error(res, ApiError(499, "invalid_request_error",
                               "the client closed the connection before the response was ready", "",
                               "client_closed_request"));
      return;
    }
  }
  send_json(res, 200, acc->response());
}

void HttpServer::tokenize(const httplib::Request& req, httplib::Response& res, const Body& text) {
  authenticate(req, false);
  const Backend& b = backend();
  const nlohmann::json body = parse_json_object(text);
  const JsonFields f(body);
  // llama.cpp says add_special, vLLM add_special_tokens; both add BOS by default here, as a
  // completion would.
  bool add_special = f.boolean("add_special").value_or(true);
  if (const auto v = f.boolean("add_special_tokens")) add_special = *v;
  const bool with_pieces = f.boolean("with_pieces").value_or(false);
  const std::vector<int32_t> ids = prompt_tokens(b, body, add_special, "/tokenize");
  nlohmann::json tokens = nlohmann::json::array();
  for (int32_t id : ids) {
    if (with_pieces) {
      tokens.push_back({{"id", id}, {"piece", b.tokenizer().piece(id)}});
    } else {
      tokens.push_back(id);
    }
  }
  send_json(res, 200,
            {{"tokens", tokens}, {"count", ids.size()}, {"max_model_len", b.context_length()}});
}

void HttpServer::detokenize(const httplib::Request& req, httplib::Response& res, const Body& text) {
  authenticate(req, false);
  const Backend& b = backend();
  const nlohmann::json body = parse_json_object(text);
  const auto* tokens = JsonFields(body).raw("tokens");
  if (!tokens || !tokens->is_array()) bad_field("tokens", "tokens must be an array of token ids");
  const std::vector<int32_t> ids =
      encode_prompt(PromptInput{std::nullopt, parse_token_ids(*tokens, "tokens")}, b.tokenizer(),
                    false, "tokens");
  send_json(res, 200, {{"content", b.tokenizer().decode(ids)}});
}

void HttpServer::apply_template(const httplib::Request& req, httplib::Response& res,
                                const Body& text) {
  authenticate(req, false);
  const Backend& b = backend();
  const nlohmann::json body = parse_json_object(text);
  const JsonFields f(body);
  const auto* m = f.raw("messages");
  if (!m) bad_field("messages", "messages is required");
  const bool add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  send_json(res, 200,
            {{"prompt", render_chat_prompt(b, parse_messages(*m), add_generation_prompt)}});
}

void HttpServer::metrics(const httplib::Request& req, httplib::Response& res) {
  // Per-tenant figures are for the operator: with keys, an admin key is needed.
  authenticate(req, true);
  const Backend& b = backend();
  std::map<int, uint64_t> responses;
  {
    MutexLock lock(responses_mu_);
    responses = responses_;
  }
  res.status = 200;
  res.set_content(b.generates()
                      ? render_metrics(b.engine(), b.model_id, tenants_.for_metrics(), responses)
                      : render_tokenizer_only_metrics(b.model_id, responses),
                  kPrometheusContentType);
}

void HttpServer::count_response(int status) {
  MutexLock lock(responses_mu_);
  ++responses_[status];
}

}  // namespace kvc::server
