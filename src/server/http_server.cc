#include "server/http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <strings.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "base/error.h"
#include "server/api_error.h"
#include "server/generation.h"
#include "server/logprobs.h"
#include "server/metrics.h"

namespace kvc::server {

namespace {

constexpr const char* kAnonymous = "anonymous";
// How long a stream waits for tokens before it checks on its client with an SSE comment.
constexpr auto kKeepAliveInterval = std::chrono::seconds(2);

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
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

// Token ids of one prompt: text through the tokenizer (BOS first when add_bos), or ids checked
// against the vocabulary. An empty text prompt becomes BOS alone, as `kvcache run` does.
std::vector<int32_t> encode_prompt(const PromptInput& p, const model::Tokenizer& tokenizer,
                                   bool add_bos, const std::string& param) {
  if (p.text) {
    std::vector<int32_t> ids = tokenizer.encode(*p.text, add_bos && tokenizer.add_bos());
    if (ids.empty() && add_bos && tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
    return ids;
  }
  for (int32_t t : p.tokens) {
    if (t >= tokenizer.size()) {
      bad_field(param, fmt::format("token id {} is outside the vocabulary of {} tokens", t,
                                   tokenizer.size()));
    }
  }
  return p.tokens;
}

void check_prompt_fits(size_t prompt_tokens, size_t context, const std::string& param) {
  if (prompt_tokens >= context) {
    throw ApiError(400, "invalid_request_error",
                   fmt::format("the prompt has {} tokens but the model's context is {} tokens "
                               "(the prompt and at least one generated token must fit)",
                               prompt_tokens, context),
                   param, "context_length_exceeded");
  }
}

// The `kvcache` object of a whole response: the first choice's figures (the one that read
// the prompt first), and with several choices each one's.
nlohmann::json kvcache_summary(const Generation& gen) {
  const double now = kv::steady_clock_ms()();
  nlohmann::json k = kvcache_json(gen.handle(0).stats(), now);
  if (gen.size() > 1) {
    nlohmann::json all = nlohmann::json::array();
    for (size_t i = 0; i < gen.size(); ++i) all.push_back(kvcache_json(gen.handle(i).stats(), now));
    k["choices"] = all;
  }
  return k;
}

// Usage over every choice: each prompt's tokens (and cached tokens) counted once, from its
// first sample; completion tokens summed over all samples.
nlohmann::json usage_of(const Generation& gen, size_t samples_per_prompt) {
  size_t prompt = 0, cached = 0, completion = 0;
  for (size_t i = 0; i < gen.size(); ++i) {
    const engine::RequestStats s = gen.handle(i).stats();
    completion += s.generated_tokens;
    if (i % samples_per_prompt == 0) {
      prompt += s.prompt_tokens;
      cached += s.cached_tokens;
    }
  }
  return usage_json(prompt, completion, cached);
}

// Why a request ended without completing, as an API error (nullopt when it completed).
std::optional<ApiError> failure_of(const engine::RequestHandle& h) {
  const std::string error = h.error();
  if (error.empty() && h.stats().finish_reason != engine::FinishReason::kCancelled)
    return std::nullopt;
  if (h.stats().finish_reason == engine::FinishReason::kCancelled) {
    return ApiError(503, "server_error", error.empty() ? "the request was cancelled" : error, "",
                    "cancelled");
  }
  return ApiError(500, "server_error", error);
}

// What a completion response looks like, shared by the whole and the streamed forms.
struct ResponseShape {
  bool chat = false;
  std::string id;
  int64_t created = 0;
  std::string model;
  size_t samples_per_prompt = 1;
  bool logprobs = false;
  int top_logprobs = 0;
  bool include_usage = false;
};

// Writes a generation as server-sent events, one provider call at a time.
class SseStream {
 public:
  SseStream(std::shared_ptr<Generation> gen, ResponseShape shape, const model::Tokenizer& tokenizer)
      : gen_(std::move(gen)),
        shape_(std::move(shape)),
        tokenizer_(tokenizer),
        text_bytes_(gen_->size(), 0),
        last_write_(std::chrono::steady_clock::now()) {}

  // Writes whatever is ready (waiting briefly for it); false once the client is gone.
  bool step(httplib::DataSink& sink) {
    std::string out;
    if (!started_) {
      started_ = true;
      if (shape_.chat) {
        for (size_t i = 0; i < gen_->size(); ++i) {
          out += sse_data(chunk({{"index", i},
                                 {"delta", {{"role", "assistant"}, {"content", ""}}},
                                 {"logprobs", nullptr},
                                 {"finish_reason", nullptr}}));
        }
      }
    }
    Generation::Event e;
    bool got = gen_->next(e, std::chrono::milliseconds(100));
    while (got) {
      append(e, out);
      if (out.size() > 16384) break;
      got = gen_->next(e, std::chrono::milliseconds(0));
    }
    const bool done = gen_->done();
    if (done) {
      if (shape_.include_usage) {
        nlohmann::json last = chunk_header();
        last["choices"] = nlohmann::json::array();
        last["usage"] = usage_of(*gen_, shape_.samples_per_prompt);
        last["kvcache"] = kvcache_summary(*gen_);
        out += sse_data(last);
      }
      out += "data: [DONE]\n\n";
    }
    const auto now = std::chrono::steady_clock::now();
    if (out.empty()) {
      // Nothing to send yet (queued, or prefilling): a comment line, which SSE clients
      // ignore, finds out whether the client is still there.
      if (now - last_write_ < kKeepAliveInterval) return true;
      out = ": keep-alive\n\n";
    }
    if (!sink.write(out.data(), out.size())) {
      gen_->cancel();
      return false;
    }
    last_write_ = now;
    if (done) sink.done();
    return true;
  }

 private:
  nlohmann::json chunk_header() const {
    nlohmann::json c = {{"id", shape_.id},
                        {"object", shape_.chat ? "chat.completion.chunk" : "text_completion"},
                        {"created", shape_.created},
                        {"model", shape_.model}};
    if (shape_.include_usage) c["usage"] = nullptr;
    return c;
  }

  nlohmann::json chunk(nlohmann::json choice) const {
    nlohmann::json c = chunk_header();
    c["choices"] = nlohmann::json::array({std::move(choice)});
    return c;
  }

  void append(const Generation::Event& e, std::string& out) {
    const size_t i = e.choice;
    if (e.finished) {
      const engine::RequestHandle& h = gen_->handle(i);
      if (const auto failure = failure_of(h)) {
        out += sse_data(failure->to_json());
        return;
      }
      const engine::RequestStats s = h.stats();
      nlohmann::json choice = {
          {"index", i},
          {"logprobs", nullptr},
          {"finish_reason", openai_finish_reason(engine::finish_reason_name(s.finish_reason))}};
      if (shape_.chat) {
        choice["delta"] = nlohmann::json::object();
      } else {
        choice["text"] = "";
      }
      nlohmann::json c = chunk(std::move(choice));
      c["kvcache"] = kvcache_json(s, kv::steady_clock_ms()());
      out += sse_data(c);
      return;
    }
    const engine::TokenEvent& t = e.token;
    nlohmann::json lp = nullptr;
    if (shape_.logprobs && t.token >= 0 && !t.logits.empty()) {
      const SampledLogprobs s = token_logprobs(t.logits, t.token, shape_.top_logprobs);
      if (shape_.chat) {
        lp = {{"content", nlohmann::json::array({chat_logprob_entry(s, tokenizer_)})}};
      } else {
        CompletionLogprobs c;
        c.add(s, tokenizer_, text_bytes_[i]);
        lp = c.to_json();
      }
    }
    if (t.text.empty() && lp.is_null()) return;
    nlohmann::json choice = {{"index", i}, {"logprobs", lp}, {"finish_reason", nullptr}};
    if (shape_.chat) {
      choice["delta"] = {{"content", t.text}};
    } else {
      choice["text"] = t.text;
    }
    text_bytes_[i] += t.text.size();
    out += sse_data(chunk(std::move(choice)));
  }

  std::shared_ptr<Generation> gen_;
  ResponseShape shape_;
  const model::Tokenizer& tokenizer_;
  std::vector<size_t> text_bytes_;
  bool started_ = false;
  std::chrono::steady_clock::time_point last_write_;
};

}  // namespace

// Counts a generation as in flight for as long as it lives.
class HttpServer::InFlight {
 public:
  explicit InFlight(HttpServer& server) : server_(server) {
    std::lock_guard lock(server_.flight_mu_);
    ++server_.in_flight_;
  }
  ~InFlight() {
    {
      std::lock_guard lock(server_.flight_mu_);
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
      svr_(std::make_unique<httplib::Server>()),
      started_at_(unix_now()) {
  const size_t threads = static_cast<size_t>(std::max(4, options_.http_threads));
  svr_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr_->set_payload_max_length(options_.max_body_bytes);
  // Tokens go out one small chunk at a time: Nagle's algorithm would hold them back.
  svr_->set_tcp_nodelay(true);
  svr_->set_keep_alive_timeout(2);
  svr_->set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                      httplib::Response& res) {
    // Statuses that no handler wrote a body for: unknown routes, oversized bodies, malformed
    // HTTP. Handlers' own errors already carry their body.
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, error_for_status(res.status, req.method, req.path, options_.max_body_bytes));
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

void HttpServer::routes() {
  using Req = httplib::Request;
  using Res = httplib::Response;
  svr_->Get("/health",
            [this](const Req& req, Res& res) { guarded(req, res, [&] { health(res); }); });
  svr_->Get("/v1/models", [this](const Req& req, Res& res) {
    guarded(req, res, [&] {
      authenticate(req, false);
      models(res);
    });
  });
  svr_->Post("/v1/completions", [this](const Req& req, Res& res) {
    guarded(req, res, [&] { completions(req, res, false); });
  });
  svr_->Post("/v1/chat/completions", [this](const Req& req, Res& res) {
    guarded(req, res, [&] { completions(req, res, true); });
  });
  svr_->Post("/tokenize",
             [this](const Req& req, Res& res) { guarded(req, res, [&] { tokenize(req, res); }); });
  svr_->Post("/detokenize", [this](const Req& req, Res& res) {
    guarded(req, res, [&] { detokenize(req, res); });
  });
  svr_->Get("/metrics",
            [this](const Req& req, Res& res) { guarded(req, res, [&] { metrics(req, res); }); });
  svr_->Get("/v1/cache", [this](const Req& req, Res& res) {
    guarded(req, res, [&] { cache_stats(req, res); });
  });
  svr_->Post("/v1/cache/explain", [this](const Req& req, Res& res) {
    guarded(req, res, [&] { cache_explain(req, res); });
  });
  svr_->Post("/v1/cache/pin",
             [this](const Req& req, Res& res) { guarded(req, res, [&] { cache_pin(req, res); }); });
  svr_->Post("/v1/cache/flush", [this](const Req& req, Res& res) {
    guarded(req, res, [&] { cache_flush(req, res); });
  });
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
  thread_ = std::thread([this] { svr_->listen_after_bind(); });
  // cpp-httplib 0.11 has no wait_until_ready(): its accept loop flags itself running.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!svr_->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return port_;
}

void HttpServer::set_ready(Backend backend) {
  backend_ = std::move(backend);
  state_ = State::kReady;
}

void HttpServer::shutdown(double drain_seconds) {
  std::lock_guard lock(shutdown_mu_);
  if (state_ == State::kStopped) return;
  if (!thread_.joinable()) {
    state_ = State::kStopped;
    return;
  }
  state_ = State::kDraining;
  // The engine refuses new requests from here on, and returns once its requests finished or,
  // at the deadline, were cancelled.
  if (backend_) backend_->engine->shutdown(drain_seconds * 1000.0);
  {
    // What remains is writing the last chunks of each response, which the socket write
    // timeout bounds.
    std::unique_lock flight(flight_mu_);
    flight_cv_.wait_for(flight, std::chrono::seconds(10), [&] { return in_flight_ == 0; });
  }
  state_ = State::kStopped;
  // Only now: cpp-httplib ends every open stream as soon as the listener stops.
  svr_->stop();
  thread_.join();
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
  if (state_ != State::kReady && state_ != State::kLoading) res.set_header("Connection", "close");
}

Tenant HttpServer::authenticate(const httplib::Request& req, bool need_admin) const {
  if (!options_.api_keys) return Tenant{kAnonymous, true};
  const std::string header = req.get_header_value("Authorization");
  if (header.empty()) {
    throw ApiError(401, "invalid_request_error",
                   "missing API key: send the header 'Authorization: Bearer KEY'", "",
                   "invalid_api_key");
  }
  if (header.size() < 8 || strncasecmp(header.c_str(), "Bearer ", 7) != 0) {
    throw ApiError(401, "invalid_request_error", "the Authorization header must be 'Bearer KEY'",
                   "", "invalid_api_key");
  }
  const std::optional<Tenant> t = options_.api_keys->find(header.substr(7));
  if (!t) throw ApiError(401, "invalid_request_error", "invalid API key", "", "invalid_api_key");
  if (need_admin && !t->admin) {
    throw ApiError(
        403, "permission_error",
        fmt::format("this endpoint needs an admin key; tenant '{}' is not an admin", t->name), "",
        "forbidden");
  }
  return *t;
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

void HttpServer::check_body(const httplib::Request& req) const {
  // cpp-httplib enforces the limit on bodies with a Content-Length; a chunked body is checked
  // here, once read.
  if (req.body.size() > options_.max_body_bytes) {
    throw error_for_status(413, req.method, req.path, options_.max_body_bytes);
  }
}

kv::Hash256 HttpServer::namespace_of(const std::string& tenant, const std::string& cache_salt) {
  // The salt is the tenant's name (nothing for the one anonymous tenant), then the request's
  // cache_salt after a newline, which no tenant name holds, so no two pairs collide.
  std::string salt = options_.api_keys ? tenant : "";
  if (!cache_salt.empty()) salt += "\n" + cache_salt;
  const kv::Hash256 ns = backend().engine->namespace_for(salt);
  // One entry per namespace a tenant used: its own, and one per distinct cache_salt, as the
  // prefix index itself keeps one per namespace.
  std::lock_guard lock(tenants_mu_);
  tenant_namespaces_[tenant].insert(ns);
  return ns;
}

std::vector<int32_t> HttpServer::prompt_tokens(const nlohmann::json& body, bool add_special,
                                               const std::string& what) {
  const Backend& b = backend();
  const model::Tokenizer& tokenizer = b.engine->tokenizer();
  const JsonFields f(body);
  if (const auto* m = f.raw("messages"))
    return b.chat_template.apply(parse_messages(*m), tokenizer);
  // llama.cpp's /tokenize calls its text "content"; the OpenAI-style endpoints say "prompt".
  const auto* p = f.raw("prompt");
  std::string param = "prompt";
  if (!p && (p = f.raw("content"))) param = "content";
  if (!p) bad_field("prompt", fmt::format("{} needs a prompt (or messages)", what));
  const std::vector<PromptInput> prompts = parse_prompts(*p);
  if (prompts.size() != 1) bad_field(param, fmt::format("{} takes one prompt", what));
  return encode_prompt(prompts[0], tokenizer, add_special, param);
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
  const auto& config = b.engine->model().config();
  send_json(res, 200,
            {{"object", "list"},
             {"data",
              {{{"id", b.model_id},
                {"object", "model"},
                {"created", started_at_},
                {"owned_by", "kvcache"},
                {"max_model_len", config.context_length}}}}});
}

void HttpServer::completions(const httplib::Request& req, httplib::Response& res, bool chat) {
  const Tenant tenant = authenticate(req, false);
  const Backend& b = backend();
  check_body(req);
  const CompletionRequest r = parse_completion_request(req.body, chat);
  engine::Engine& engine = *b.engine;
  const model::Tokenizer& tokenizer = engine.tokenizer();
  const size_t context = static_cast<size_t>(engine.model().config().context_length);

  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> stop = r.stop;
  std::vector<int32_t> stop_tokens = r.stop_token_ids;
  for (int32_t t : stop_tokens) {
    if (t >= tokenizer.size()) {
      bad_field("stop_token_ids", fmt::format("token id {} is outside the vocabulary of {} tokens",
                                              t, tokenizer.size()));
    }
  }
  if (chat) {
    prompts.push_back(b.chat_template.apply(r.messages, tokenizer));
    if (!r.ignore_eos) b.chat_template.end_of_turn(tokenizer, stop_tokens, stop);
  } else {
    for (const auto& p : r.prompts) prompts.push_back(encode_prompt(p, tokenizer, true, "prompt"));
  }
  for (const auto& p : prompts) check_prompt_fits(p.size(), context, chat ? "messages" : "prompt");

  const kv::Hash256 ns = namespace_of(tenant.name, r.cache_salt);
  const uint64_t seed = r.seed ? *r.seed : random_seed();
  // Without max_tokens a chat reply may run to the end of the context, or of what the KV pool
  // holds when that is less, so that leaving it out is never refused as too large.
  const size_t pool_tokens = engine.num_blocks() * engine.geometry().block_tokens;
  const size_t room = std::min(context, pool_tokens);
  std::vector<engine::Request> requests;
  for (const auto& prompt : prompts) {
    for (int j = 0; j < r.n; ++j) {
      engine::Request q;
      q.prompt = prompt;
      q.sampling.temperature = r.temperature;
      q.sampling.top_k = r.top_k;
      q.sampling.top_p = r.top_p;
      q.sampling.min_p = r.min_p;
      q.sampling.repeat_penalty = r.repetition_penalty;
      // Samples of one call differ by seed; the prefix cache lets them share the prompt.
      q.sampling.seed = seed + requests.size();
      // OpenAI's defaults: 16 tokens for completions, the rest of the room for chat.
      if (r.max_tokens) {
        q.max_tokens = *r.max_tokens;
      } else if (chat) {
        q.max_tokens = room > prompt.size() + 1 ? static_cast<int>(room - prompt.size()) : 1;
      } else {
        q.max_tokens = 16;
      }
      q.stop = stop;
      q.stop_tokens = stop_tokens;
      q.ignore_eos = r.ignore_eos;
      q.ns = ns;
      // Sessions are per tenant: two tenants' "session 1" are different conversations.
      if (!r.session_id.empty() && requests.empty()) {
        q.session_id = tenant.name + "\n" + r.session_id;
      }
      q.record_logits = r.logprobs;
      requests.push_back(std::move(q));
    }
  }

  auto flight = std::make_shared<InFlight>(*this);
  auto gen = std::make_shared<Generation>(engine, std::move(requests));
  ResponseShape shape;
  shape.chat = chat;
  shape.id = new_response_id(chat ? "chatcmpl-" : "cmpl-");
  shape.created = unix_now();
  shape.model = b.model_id;
  shape.samples_per_prompt = static_cast<size_t>(r.n);
  shape.logprobs = r.logprobs;
  shape.top_logprobs = r.top_logprobs;
  shape.include_usage = r.include_usage;

  if (r.stream) {
    auto stream = std::make_shared<SseStream>(gen, shape, tokenizer);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [stream](size_t, httplib::DataSink& sink) { return stream->step(sink); },
        // Runs when the response ends, however it ends: a client that went away before the
        // stream finished cancels its requests, which frees their blocks within one step.
        [gen, flight](bool) { gen->cancel(); });
    return;
  }

  struct Choice {
    std::string text;
    nlohmann::json chat_logprobs = nlohmann::json::array();
    CompletionLogprobs logprobs;
  };
  std::vector<Choice> out(gen->size());
  Generation::Event e;
  while (!gen->done()) {
    if (!gen->next(e, std::chrono::milliseconds(1000)) || e.finished) continue;
    Choice& c = out[e.choice];
    if (r.logprobs && e.token.token >= 0 && !e.token.logits.empty()) {
      const SampledLogprobs lp = token_logprobs(e.token.logits, e.token.token, r.top_logprobs);
      if (chat) {
        c.chat_logprobs.push_back(chat_logprob_entry(lp, tokenizer));
      } else {
        c.logprobs.add(lp, tokenizer, c.text.size());
      }
    }
    c.text += e.token.text;
  }
  nlohmann::json choices = nlohmann::json::array();
  for (size_t i = 0; i < gen->size(); ++i) {
    if (const auto failure = failure_of(gen->handle(i))) throw *failure;
    nlohmann::json choice = {
        {"index", i},
        {"finish_reason",
         openai_finish_reason(engine::finish_reason_name(gen->handle(i).stats().finish_reason))}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", out[i].text}};
      choice["logprobs"] =
          r.logprobs ? nlohmann::json{{"content", out[i].chat_logprobs}} : nlohmann::json(nullptr);
    } else {
      choice["text"] = out[i].text;
      choice["logprobs"] = r.logprobs ? out[i].logprobs.to_json() : nlohmann::json(nullptr);
    }
    choices.push_back(std::move(choice));
  }
  send_json(res, 200,
            {{"id", shape.id},
             {"object", chat ? "chat.completion" : "text_completion"},
             {"created", shape.created},
             {"model", shape.model},
             {"choices", choices},
             {"usage", usage_of(*gen, shape.samples_per_prompt)},
             {"kvcache", kvcache_summary(*gen)}});
}

void HttpServer::tokenize(const httplib::Request& req, httplib::Response& res) {
  authenticate(req, false);
  const Backend& b = backend();
  check_body(req);
  const nlohmann::json body = parse_json_object(req.body);
  const JsonFields f(body);
  // llama.cpp says add_special, vLLM add_special_tokens; both add BOS by default here, as a
  // completion would.
  bool add_special = f.boolean("add_special").value_or(true);
  if (const auto v = f.boolean("add_special_tokens")) add_special = *v;
  const bool with_pieces = f.boolean("with_pieces").value_or(false);
  const std::vector<int32_t> ids = prompt_tokens(body, add_special, "/tokenize");
  nlohmann::json tokens = nlohmann::json::array();
  for (int32_t id : ids) {
    if (with_pieces) {
      tokens.push_back({{"id", id}, {"piece", b.engine->tokenizer().piece(id)}});
    } else {
      tokens.push_back(id);
    }
  }
  send_json(res, 200,
            {{"tokens", tokens},
             {"count", ids.size()},
             {"max_model_len", b.engine->model().config().context_length}});
}

void HttpServer::detokenize(const httplib::Request& req, httplib::Response& res) {
  authenticate(req, false);
  const Backend& b = backend();
  check_body(req);
  const nlohmann::json body = parse_json_object(req.body);
  const auto* tokens = JsonFields(body).raw("tokens");
  if (!tokens || !tokens->is_array()) bad_field("tokens", "tokens must be an array of token ids");
  const std::vector<int32_t> ids =
      encode_prompt(PromptInput{std::nullopt, parse_token_ids(*tokens, "tokens")},
                    b.engine->tokenizer(), false, "tokens");
  send_json(res, 200, {{"content", b.engine->tokenizer().decode(ids)}});
}

void HttpServer::metrics(const httplib::Request& req, httplib::Response& res) {
  // Per-tenant figures are for the operator: with keys, an admin key is needed.
  authenticate(req, true);
  const Backend& b = backend();
  std::vector<TenantNamespaces> tenants;
  {
    std::lock_guard lock(tenants_mu_);
    for (const auto& [name, spaces] : tenant_namespaces_) {
      tenants.push_back({name, {spaces.begin(), spaces.end()}});
    }
    // Tenants that have not sent a request yet still get their (zero) series.
    if (options_.api_keys) {
      for (const auto& name : options_.api_keys->tenant_names()) {
        if (!tenant_namespaces_.count(name)) tenants.push_back({name, {}});
      }
    }
  }
  std::map<int, uint64_t> responses;
  {
    std::lock_guard lock(responses_mu_);
    responses = responses_;
  }
  res.status = 200;
  res.set_content(render_metrics(*b.engine, b.model_id, tenants, responses),
                  kPrometheusContentType);
}

void HttpServer::cache_stats(const httplib::Request& req, httplib::Response& res) {
  const Tenant tenant = authenticate(req, false);
  const Backend& b = backend();
  const engine::Engine& engine = *b.engine;
  const engine::EngineStats st = engine.stats();
  const kv::KvGeometry& g = engine.geometry();
  kv::NamespaceStats own;
  {
    std::set<kv::Hash256> spaces;
    {
      std::lock_guard lock(tenants_mu_);
      if (auto it = tenant_namespaces_.find(tenant.name); it != tenant_namespaces_.end()) {
        spaces = it->second;
      }
    }
    for (const auto& ns : spaces) {
      const kv::NamespaceStats n = engine.namespace_stats(ns);
      own.blocks += n.blocks;
      own.queried_tokens += n.queried_tokens;
      own.hit_tokens += n.hit_tokens;
    }
  }
  const auto rate = [](uint64_t hit, uint64_t queried) {
    return queried ? static_cast<double>(hit) / static_cast<double>(queried) : 0.0;
  };
  nlohmann::json j = {{"model", b.model_id},
                      {"prefix_cache_enabled", engine.options().prefix_cache},
                      {"block_tokens", g.block_tokens},
                      {"bytes_per_token", g.bytes_per_token()},
                      {"bytes_per_block", g.bytes_per_block()},
                      {"pool_bytes", engine.arena_bytes()},
                      {"blocks",
                       {{"total", st.blocks.total},
                        {"free", st.blocks.free},
                        {"cached", st.blocks.cached},
                        {"pinned", st.blocks.pinned},
                        {"referenced", st.blocks.referenced}}},
                      {"usage", st.blocks.total ? static_cast<double>(st.blocks.referenced) /
                                                      static_cast<double>(st.blocks.total)
                                                : 0.0},
                      {"tenant",
                       {{"name", tenant.name},
                        {"cached_blocks", own.blocks},
                        {"queried_tokens", own.queried_tokens},
                        {"hit_tokens", own.hit_tokens},
                        {"hit_rate", rate(own.hit_tokens, own.queried_tokens)}}}};
  // Figures summed over every tenant are for the admin only: they move when other tenants'
  // requests hit.
  if (tenant.admin) {
    j["prefix_cache"] = {{"cached_blocks", st.cache.nodes},
                         {"namespaces", st.cache.namespaces},
                         {"inserted_blocks", st.cache.inserted_blocks},
                         {"evicted_blocks", st.cache.evicted_blocks},
                         {"queried_tokens", st.cache.queried_tokens},
                         {"hit_tokens", st.cache.hit_tokens},
                         {"hit_rate", rate(st.cache.hit_tokens, st.cache.queried_tokens)}};
    j["requests"] = {{"running", st.running},
                     {"waiting", st.waiting},
                     {"finished", st.finished},
                     {"cancelled", st.cancelled},
                     {"rejected_overloaded", st.rejected_overloaded},
                     {"rejected_too_large", st.rejected_too_large},
                     {"preemptions", st.preemptions}};
    j["sessions"] = st.sessions;
  }
  send_json(res, 200, j);
}

void HttpServer::cache_explain(const httplib::Request& req, httplib::Response& res) {
  const Tenant tenant = authenticate(req, false);
  const Backend& b = backend();
  check_body(req);
  const nlohmann::json body = parse_json_object(req.body);
  const JsonFields f(body);
  const std::string salt = f.string("cache_salt").value_or("");
  const std::vector<int32_t> tokens = prompt_tokens(body, true, "/v1/cache/explain");
  if (tokens.empty()) bad_field("prompt", "the prompt has no tokens");
  const kv::PrefixMatch m = b.engine->explain(namespace_of(tenant.name, salt), tokens);
  send_json(res, 200,
            {{"prompt_tokens", tokens.size()},
             {"cached_tokens", m.cached_tokens},
             {"would_hit", m.cached_tokens > 0},
             {"shared_blocks", m.shared_blocks},
             {"copied_tokens", m.copied_tokens},
             {"miss", miss_json(m.miss, kv::steady_clock_ms()())}});
}

void HttpServer::cache_pin(const httplib::Request& req, httplib::Response& res) {
  const Tenant tenant = authenticate(req, true);
  const Backend& b = backend();
  check_body(req);
  const nlohmann::json body = parse_json_object(req.body);
  const JsonFields f(body);
  const auto ttl = f.number("ttl_seconds", 0.0, 30.0 * 24 * 3600);
  if (!ttl || *ttl <= 0) bad_field("ttl_seconds", "ttl_seconds must be a number above 0");
  // An admin may pin a prefix in another tenant's namespace (a shared system prompt).
  std::string target = tenant.name;
  if (const auto t = f.string("tenant")) {
    const auto names = options_.api_keys ? options_.api_keys->tenant_names()
                                         : std::vector<std::string>{kAnonymous};
    if (std::find(names.begin(), names.end(), *t) == names.end()) {
      bad_field("tenant", fmt::format("unknown tenant '{}'", *t));
    }
    target = *t;
  }
  const std::string salt = f.string("cache_salt").value_or("");
  const std::vector<int32_t> tokens = prompt_tokens(body, true, "/v1/cache/pin");
  if (tokens.empty()) bad_field("prompt", "the prompt has no tokens");
  check_prompt_fits(tokens.size(), static_cast<size_t>(b.engine->model().config().context_length),
                    "prompt");
  engine::Engine& engine = *b.engine;
  const kv::Hash256 ns = namespace_of(target, salt);
  // Pinning keeps cached blocks; a prefix that is not cached yet is computed first, by a
  // one-token request.
  bool warmed = false;
  if (engine.explain(ns, tokens).miss.kind != kv::MissKind::kNone) {
    engine::Request q;
    q.prompt = tokens;
    q.max_tokens = 1;
    q.sampling.temperature = 0.0f;
    q.ns = ns;
    InFlight flight(*this);
    Generation gen(engine, {q});
    Generation::Event e;
    while (!gen.done()) gen.next(e, std::chrono::milliseconds(1000));
    if (const auto failure = failure_of(gen.handle(0))) throw *failure;
    warmed = true;
  }
  const size_t pinned = engine.pin(ns, tokens, *ttl * 1000.0).tokens;
  send_json(res, 200,
            {{"tenant", target},
             {"prompt_tokens", tokens.size()},
             {"pinned_tokens", pinned},
             {"warmed", warmed},
             {"ttl_seconds", *ttl}});
}

void HttpServer::cache_flush(const httplib::Request& req, httplib::Response& res) {
  authenticate(req, true);
  const Backend& b = backend();
  send_json(res, 200, {{"flushed_blocks", b.engine->flush_cache()}});
}

void HttpServer::count_response(int status) {
  std::lock_guard lock(responses_mu_);
  ++responses_[status];
}

}  // namespace kvc::server
