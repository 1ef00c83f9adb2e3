// The HTTP API under bad input and bad luck: auth and tenant isolation, oversized and
// malformed bodies, prompts longer than the context, overload, clients that vanish
// mid-stream, and graceful shutdown.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "server/http_server.h"
#include "server_fixture.h"

namespace kvc::server {
namespace {

using testing::get;
using ::testing::HasSubstr;
using testing::ids;
using testing::json;
using testing::post;
using testing::stream;
using testing::TestServer;
using testing::tiny_model;

// The tiny synthetic model with more layers, so that a long generation takes long enough for a
// test to act while it runs.
std::string slow_tiny() {
  return kvc::testing::synthetic_model_path("tiny", DType::F32, 8);
}

ServerOptions with_keys() {
  ServerOptions o;
  o.api_keys = ApiKeys::parse("sk-alice alice admin\nsk-bob bob\n", "keys");
  return o;
}

void expect_error(const testing::Reply& r, int status, const std::string& type,
                  const std::string& message) {
  EXPECT_EQ(r.status, status) << r.text;
  ASSERT_TRUE(r.body.is_object()) << r.text;
  ASSERT_TRUE(r.body.contains("error")) << r.text;
  const json& e = r.body["error"];
  EXPECT_EQ(e["type"], type) << r.text;
  EXPECT_THAT(e["message"].get<std::string>(), HasSubstr(message));
  EXPECT_TRUE(e.contains("param"));
  EXPECT_TRUE(e.contains("code"));
}

TEST(HttpHardening, KeysAreRequiredAndMapToTenants) {
  TestServer s(tiny_model(), TestServer::default_engine(), with_keys());
  const json body = {{"prompt", "hi"}, {"max_tokens", 2}};
  auto r = post(s, "/v1/completions", body);
  expect_error(r, 401, "invalid_request_error", "missing API key");
  EXPECT_EQ(r.body["error"]["code"], "invalid_api_key");
  expect_error(post(s, "/v1/completions", body, "sk-mallory"), 401, "invalid_request_error",
               "invalid API key");
  auto c = s.client();
  expect_error(testing::to_reply(c.Post("/v1/completions", {{"Authorization", "Basic c2stYm9i"}},
                                        body.dump(), "application/json")),
               401, "invalid_request_error", "must be 'Bearer KEY'");
  for (const char* path : {"/v1/models", "/v1/cache", "/metrics"}) {
    EXPECT_EQ(get(s, path).status, 401) << path;
  }
  for (const char* path : {"/tokenize", "/detokenize", "/v1/cache/explain", "/v1/cache/pin",
                           "/v1/cache/flush", "/v1/chat/completions"}) {
    EXPECT_EQ(post(s, path, json::object()).status, 401) << path;
  }
  // Liveness needs no key.
  EXPECT_EQ(get(s, "/health").status, 200);
  EXPECT_EQ(post(s, "/v1/completions", body, "sk-bob").status, 200);
  EXPECT_EQ(get(s, "/v1/models", "sk-bob").status, 200);

  // Pin, flush and /metrics need the admin key.
  const json pin = {{"prompt", "hello"}, {"ttl_seconds", 10}};
  r = post(s, "/v1/cache/pin", pin, "sk-bob");
  expect_error(r, 403, "permission_error", "needs an admin key");
  EXPECT_EQ(r.body["error"]["code"], "forbidden");
  expect_error(post(s, "/v1/cache/flush", json::object(), "sk-bob"), 403, "permission_error",
               "tenant 'bob' is not an admin");
  expect_error(get(s, "/metrics", "sk-bob"), 403, "permission_error", "admin");
  EXPECT_EQ(post(s, "/v1/cache/pin", pin, "sk-alice").status, 200);
  EXPECT_EQ(post(s, "/v1/cache/flush", json::object(), "sk-alice").status, 200);
  EXPECT_EQ(get(s, "/metrics", "sk-alice").status, 200);
}

TEST(HttpHardening, TenantsNeverShareCachedPrefixes) {
  TestServer s(tiny_model(), TestServer::default_engine(), with_keys());
  const json body = {{"prompt", ids(80, 1)}, {"max_tokens", 3}};
  const auto cached = [](const testing::Reply& r) {
    return r.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  };
  auto r = post(s, "/v1/completions", body, "sk-alice");
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(cached(r), 0);
  EXPECT_GE(cached(post(s, "/v1/completions", body, "sk-alice")), 64);
  // Bob's identical prompt finds nothing of Alice's: a cold miss, not a hint that it exists.
  auto explain = post(s, "/v1/cache/explain", body, "sk-bob");
  EXPECT_EQ(explain.body["cached_tokens"], 0);
  EXPECT_EQ(explain.body["miss"]["kind"], "cold");
  r = post(s, "/v1/completions", body, "sk-bob");
  EXPECT_EQ(cached(r), 0);
  EXPECT_EQ(r.body["kvcache"]["miss"]["kind"], "cold");
  EXPECT_GE(cached(post(s, "/v1/completions", body, "sk-bob")), 64);
  // A cache_salt is a namespace of its own, within the tenant.
  json salted = body;
  salted["cache_salt"] = "private";
  EXPECT_EQ(cached(post(s, "/v1/completions", salted, "sk-alice")), 0);
  EXPECT_GE(cached(post(s, "/v1/completions", salted, "sk-alice")), 64);

  // Bob's cache view holds his figures only; the admin sees the totals.
  r = get(s, "/v1/cache", "sk-bob");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.body["tenant"]["name"], "bob");
  EXPECT_FALSE(r.body.contains("prefix_cache"));
  EXPECT_FALSE(r.body.contains("requests"));
  EXPECT_GT(r.body["tenant"]["hit_tokens"].get<int>(), 0);
  EXPECT_TRUE(get(s, "/v1/cache", "sk-alice").body.contains("prefix_cache"));
  // Per-tenant metrics are labelled by tenant name and add up to the total.
  const auto m = get(s, "/metrics", "sk-alice");
  std::vector<std::string> errors;
  const auto f = testing::parse_prometheus(m.text, errors);
  EXPECT_THAT(errors, ::testing::IsEmpty());
  const double alice =
      testing::prom_value(f, "kvcache_tenant_prefix_cache_hit_tokens_total", {{"tenant", "alice"}});
  const double bob =
      testing::prom_value(f, "kvcache_tenant_prefix_cache_hit_tokens_total", {{"tenant", "bob"}});
  EXPECT_GT(alice, bob);
  EXPECT_GT(bob, 0);
  EXPECT_EQ(alice + bob, testing::prom_value(f, "kvcache_prefix_cache_hit_tokens_total"));
}

TEST(HttpHardening, OversizedBodiesGet413) {
  ServerOptions o;
  o.max_body_bytes = 4096;
  TestServer s(tiny_model(), TestServer::default_engine(), o);
  const std::string big = json{{"prompt", std::string(10000, 'a')}}.dump();
  auto r = post(s, "/v1/completions", big);
  expect_error(r, 413, "invalid_request_error", "larger than the limit of 4096 bytes");
  EXPECT_EQ(r.body["error"]["code"], "request_too_large");
  // A chunked body has no Content-Length to check up front: it is refused once read.
  auto c = s.client();
  r = testing::to_reply(c.Post(
      "/v1/completions",
      [&](size_t offset, httplib::DataSink& sink) {
        if (offset == 0) {
          sink.write(big.data(), big.size());
        } else {
          sink.done();
        }
        return true;
      },
      "application/json"));
  expect_error(r, 413, "invalid_request_error", "4096 bytes");
  // The server goes on serving.
  EXPECT_EQ(post(s, "/v1/completions", json{{"prompt", "a"}, {"max_tokens", 1}}).status, 200);
}

TEST(HttpHardening, MalformedRequestsGet400NamingTheField) {
  TestServer s(tiny_model());
  auto r = post(s, "/v1/completions", std::string(R"({"prompt": "x", )"));
  expect_error(r, 400, "invalid_request_error", "not valid JSON");
  EXPECT_TRUE(r.body["error"]["param"].is_null());
  r = post(s, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", "many"}});
  expect_error(r, 400, "invalid_request_error", "max_tokens must be an integer");
  EXPECT_EQ(r.body["error"]["param"], "max_tokens");
  r = post(s, "/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", 5}}}}});
  EXPECT_EQ(r.body["error"]["param"], "messages[0].content");
  r = post(s, "/v1/completions", json{{"prompt", "x"}, {"temperature", -1}});
  EXPECT_EQ(r.body["error"]["param"], "temperature");
  r = post(s, "/v1/completions", json{{"prompt", {1, 2, 100000}}});
  expect_error(r, 400, "invalid_request_error", "token id 100000 is outside the vocabulary");
  EXPECT_EQ(r.body["error"]["param"], "prompt");
  r = post(s, "/v1/completions", json{{"prompt", "x"}, {"stop_token_ids", {100000}}});
  EXPECT_EQ(r.body["error"]["param"], "stop_token_ids");
  // Unknown routes and methods answer in the same shape.
  expect_error(get(s, "/v2/everything"), 404, "not_found_error", "no route for GET /v2/everything");
  expect_error(get(s, "/v1/completions"), 405, "invalid_request_error",
               "Method Not Allowed: GET /v1/completions");
}

TEST(HttpHardening, PromptLongerThanTheContextGets400WithBothLengths) {
  TestServer s(tiny_model());
  auto r = post(s, "/v1/completions", json{{"prompt", ids(600, 1)}});
  expect_error(r, 400, "invalid_request_error",
               "the prompt has 600 tokens but the model's context is 512 tokens");
  EXPECT_EQ(r.body["error"]["param"], "prompt");
  EXPECT_EQ(r.body["error"]["code"], "context_length_exceeded");
  std::string words;
  for (int i = 0; i < 700; ++i) {
    words += 'w';
    words += std::to_string(i);
    words += ' ';
  }
  r = post(s, "/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", words}}}}});
  expect_error(r, 400, "invalid_request_error", "but the model's context is 512 tokens");
  EXPECT_EQ(r.body["error"]["param"], "messages");
  // A request whose prompt and output could never fit the KV pool is refused too.
  engine::EngineOptions eo = TestServer::default_engine();
  eo.kv_memory_bytes =
      s.model->config().kv_geometry(DType::F16, DType::F16, 16).bytes_per_block() * 8;
  TestServer small(tiny_model(), eo);
  r = post(small, "/v1/completions", json{{"prompt", ids(20, 1)}, {"max_tokens", 400}});
  expect_error(r, 400, "invalid_request_error", "KV blocks");
  EXPECT_EQ(r.body["error"]["param"], "max_tokens");
}

TEST(HttpHardening, OverloadGets429WithRetryAfter) {
  engine::EngineOptions eo = TestServer::default_engine();
  eo.max_running = 1;
  eo.max_waiting = 1;
  TestServer s(slow_tiny(), eo);
  const json body = {
      {"prompt", ids(10, 1)}, {"max_tokens", 300}, {"ignore_eos", true}, {"stream", true}};
  int overloaded = 0, completed = 0;
  // Six clients at once against one running slot and one queue place: some must be turned
  // away (the engine would have to finish a 300-token request in the time the next arrives).
  for (int attempt = 0; attempt < 3 && overloaded == 0; ++attempt) {
    std::vector<std::future<testing::SseResult>> clients;
    std::promise<void> go;
    std::shared_future<void> start = go.get_future().share();
    for (int i = 0; i < 6; ++i) {
      clients.push_back(std::async(std::launch::async, [&, start] {
        start.wait();
        return stream(s, "/v1/completions", body);
      }));
    }
    go.set_value();
    for (auto& c : clients) {
      const testing::SseResult r = c.get();
      if (r.status == 429) {
        ++overloaded;
        const json e = json::parse(r.raw);
        EXPECT_EQ(e["error"]["type"], "rate_limit_error");
        EXPECT_EQ(e["error"]["code"], "overloaded");
        auto it = r.headers.find("Retry-After");
        ASSERT_NE(it, r.headers.end());
        EXPECT_EQ(it->second, "1");
      } else {
        EXPECT_EQ(r.status, 200) << r.raw;
        EXPECT_TRUE(r.done);
        ++completed;
      }
    }
  }
  EXPECT_GT(overloaded, 0);
  EXPECT_GT(completed, 0);
  EXPECT_GE(s.engine->stats().rejected_overloaded, static_cast<uint64_t>(overloaded));
}

TEST(HttpHardening, ClientThatDisconnectsMidStreamFreesItsBlocks) {
  TestServer s(slow_tiny());
  const int max_tokens = 480;
  const json body = {
      {"prompt", ids(20, 2)}, {"max_tokens", max_tokens}, {"ignore_eos", true}, {"stream", true}};
  int seen = 0;
  const testing::SseResult r = stream(s, "/v1/completions", body, "", [&](const json&) {
    return ++seen < 3;  // hang up after three events
  });
  EXPECT_EQ(r.status, 200);
  EXPECT_FALSE(r.done);
  // The server notices at its next write and cancels; the engine frees the blocks in a step.
  EXPECT_TRUE(testing::eventually([&] {
    const engine::EngineStats st = s.engine->stats();
    return st.running == 0 && st.blocks.referenced == 0;
  }));
  const engine::EngineStats st = s.engine->stats();
  EXPECT_EQ(st.cancelled, 1u);
  EXPECT_LT(st.generated_tokens, static_cast<uint64_t>(max_tokens));
  EXPECT_EQ(st.blocks.free + st.blocks.cached, st.blocks.total);
}

TEST(HttpHardening, ShutdownDrainsInFlightStreams) {
  TestServer s(slow_tiny());
  const json body = {{"prompt", ids(12, 3)},
                     {"max_tokens", 200},
                     {"ignore_eos", true},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  std::promise<void> first;
  std::atomic<bool> signalled{false};
  auto client = std::async(std::launch::async, [&] {
    return stream(s, "/v1/completions", body, "", [&](const json&) {
      if (!signalled.exchange(true)) first.set_value();
      return true;
    });
  });
  first.get_future().wait();
  auto stopping = std::async(std::launch::async, [&] { s.http->shutdown(30); });
  // New work is refused while the stream drains (503, or no connection once it is closed).
  EXPECT_TRUE(testing::eventually([&] {
    return post(s, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 1}}).status != 200;
  }));
  const testing::SseResult r = client.get();
  stopping.get();
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.done);
  EXPECT_THAT(r.errors, ::testing::IsEmpty());
  ASSERT_GE(r.events.size(), 2u);
  EXPECT_EQ(r.events.back()["usage"]["completion_tokens"], 200);
  EXPECT_EQ(r.events[r.events.size() - 2]["choices"][0]["finish_reason"], "length");
  // The listener is closed now.
  EXPECT_EQ(get(s, "/health").status, -1);
}

TEST(HttpHardening, ShutdownWithoutDrainTimeEndsStreamsWithAnError) {
  TestServer s(slow_tiny());
  const json body = {
      {"prompt", ids(12, 4)}, {"max_tokens", 480}, {"ignore_eos", true}, {"stream", true}};
  std::promise<void> first;
  std::atomic<bool> signalled{false};
  auto client = std::async(std::launch::async, [&] {
    return stream(s, "/v1/completions", body, "", [&](const json&) {
      if (!signalled.exchange(true)) first.set_value();
      return true;
    });
  });
  first.get_future().wait();
  s.http->shutdown(0);
  const testing::SseResult r = client.get();
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.done);
  ASSERT_FALSE(r.events.empty());
  const json& last = r.events.back();
  ASSERT_TRUE(last.contains("error")) << last;
  EXPECT_EQ(last["error"]["code"], "cancelled");
  EXPECT_THAT(last["error"]["message"].get<std::string>(), HasSubstr("shutting down"));
  EXPECT_EQ(s.engine->stats().cancelled, 1u);
}

}  // namespace
}  // namespace kvc::server
