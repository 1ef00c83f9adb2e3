// The server defects of the OpenAI-compatibility review, each reproduced over real loopback
// HTTP: deeply nested JSON, numbers beyond a double, tiny sampling values, prompts too large
// for the KV pool, clients that leave during a non-streaming request or half-close after
// theirs, Expect: 100-continue against the body deadline, and wrong methods on known paths.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "raw_connection.h"
#include "server/http_server.h"
#include "server_fixture.h"

namespace kvc::server {
namespace {

using testing::get;
using ::testing::HasSubstr;
using testing::ids;
using testing::json;
using testing::post;
using testing::RawConnection;
using testing::seconds_since;
using testing::TestServer;
using testing::tiny_model;
using Clock = std::chrono::steady_clock;

std::string post_request(const std::string& path, const std::string& body,
                         const std::string& extra_headers = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n" + extra_headers + "\r\n" + body;
}

void expect_error(const testing::Reply& r, int status, const std::string& param,
                  const std::string& message) {
  EXPECT_EQ(r.status, status) << r.text;
  ASSERT_TRUE(r.body.is_object()) << r.text;
  EXPECT_EQ(r.body["error"]["type"], "invalid_request_error") << r.text;
  if (param.empty()) {
    EXPECT_TRUE(r.body["error"]["param"].is_null()) << r.text;
  } else {
    EXPECT_EQ(r.body["error"]["param"], param) << r.text;
  }
  EXPECT_THAT(r.body["error"]["message"].get<std::string>(), HasSubstr(message));
}

// Finding 1: a 100,000-level array in a message used to overflow the connection thread's stack
// (the whole server died); every JSON endpoint now refuses it at parse.
TEST(HttpReview, DeeplyNestedJsonGets400AndTheServerStaysUp) {
  TestServer s(tiny_model());
  const int depth = 100000;
  const std::string body = R"({"messages": [{"role": "user", "content": "hi", "x": )" +
                           std::string(depth, '[') + std::string(depth, ']') + "}]}";
  for (const char* path :
       {"/v1/chat/completions", "/tokenize", "/apply-template", "/v1/cache/explain"}) {
    SCOPED_TRACE(path);
    expect_error(post(s, path, body), 400, "", "nested deeper than 128 levels");
  }
  EXPECT_EQ(get(s, "/health").status, 200);
}

// Finding 4: nlohmann reports 1e400 as out_of_range, which used to answer 500.
TEST(HttpReview, NumberBeyondADoubleGets400) {
  TestServer s(tiny_model());
  expect_error(post(s, "/v1/completions", std::string(R"({"prompt": "hi", "temperature": 1e400})")),
               400, "", "not valid JSON");
}

// Findings 6 and 8: a tiny temperature is greedy (it used to pick the least likely token), and
// values the sampler cannot hold are refused under the API's field names.
TEST(HttpReview, TinyTemperatureIsGreedyAndSamplingErrorsNameTheApiField) {
  TestServer s(tiny_model());
  const auto text = [&](const json& temperature) {
    const auto r = post(s, "/v1/completions",
                        json{{"prompt", ids(12, 1)},
                             {"max_tokens", 12},
                             {"ignore_eos", true},
                             {"seed", 3},
                             {"temperature", temperature}});
    EXPECT_EQ(r.status, 200) << r.text;
    return r.body["choices"][0]["text"].get<std::string>();
  };
  const std::string greedy = text(0);
  EXPECT_EQ(text(1e-45), greedy);
  EXPECT_EQ(text(1e-7), greedy);
  for (const char* field : {"top_p", "repetition_penalty"}) {
    for (double value : {1e-300, 1e-40}) {
      const auto r = post(s, "/v1/completions", json{{"prompt", "hi"}, {field, value}});
      expect_error(r, 400, field, std::string(field) + " must be greater than 0");
      EXPECT_THAT(r.text, ::testing::Not(HasSubstr("repeat_penalty")));
      EXPECT_THAT(r.text, ::testing::Not(HasSubstr("got 0")));
    }
  }
}

// Finding 7: a prompt that alone does not fit the KV pool names the prompt (or messages), not
// max_tokens, which the client may not even have sent.
TEST(HttpReview, PromptTooLargeForThePoolNamesThePromptNotMaxTokens) {
  engine::EngineOptions eo = TestServer::default_engine();
  eo.kv_memory_bytes = 65536;
  eo.block_tokens = 16;
  eo.kv_k_dtype = eo.kv_v_dtype = DType::F32;
  TestServer s(tiny_model(), eo);
  const size_t pool_tokens = s.engine->num_blocks() * 16;
  const size_t context = static_cast<size_t>(s.engine->model().config().context_length);
  ASSERT_LT(pool_tokens + 1, context);  // the context check alone would not catch it

  auto r = post(s, "/v1/completions", json{{"prompt", ids(pool_tokens, 2)}});
  expect_error(r, 400, "prompt", "shorten the prompt");
  EXPECT_EQ(r.body["error"]["code"], "context_length_exceeded");
  EXPECT_THAT(r.text, ::testing::Not(HasSubstr("max_tokens")));

  // A chat prompt between the pool and the context, measured through /tokenize.
  std::string content;
  json messages;
  size_t tokens = 0;
  while (tokens <= pool_tokens) {
    content += "hello there ";
    messages = json::array({{{"role", "user"}, {"content", content}}});
    tokens = post(s, "/tokenize", json{{"messages", messages}}).body["count"].get<size_t>();
  }
  ASSERT_LT(tokens, context);
  r = post(s, "/v1/chat/completions", json{{"messages", messages}});
  expect_error(r, 400, "messages", "shorten the messages");

  // A prompt that fits but leaves too little room for max_tokens still names max_tokens.
  r = post(s, "/v1/completions", json{{"prompt", ids(10, 3)}, {"max_tokens", pool_tokens}});
  expect_error(r, 400, "max_tokens", "lower max_tokens");
}

// Finding 2: a non-streaming request used to generate to the end after its client left.
TEST(HttpReview, ClientThatClosesDuringANonStreamingRequestCancelsIt) {
  engine::EngineOptions eo = TestServer::default_engine();
  // At least 25 ms a step: 400 steps (10 s) take far longer than the test waits, even under a
  // sanitizer on a busy machine.
  eo.before_forward = [] { std::this_thread::sleep_for(std::chrono::milliseconds(25)); };
  TestServer s(tiny_model(), eo);
  const int n = 2, max_tokens = 400;
  {
    RawConnection c(s.port);
    ASSERT_TRUE(c.connected());
    c.send(post_request(
        "/v1/completions",
        json{{"prompt", ids(12, 5)}, {"n", n}, {"max_tokens", max_tokens}, {"ignore_eos", true}}
            .dump()));
    ASSERT_TRUE(testing::eventually([&] { return s.engine->stats().running == 2; }));
    // Past the moment in which a close counts as a half-close that came with the request.
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
  }
  const auto closed = Clock::now();
  EXPECT_TRUE(testing::eventually([&] {
    const engine::EngineStats st = s.engine->stats();
    return st.running == 0 && st.blocks.referenced == 0;
  }));
  EXPECT_LT(seconds_since(closed), 5.0);
  const engine::EngineStats st = s.engine->stats();
  EXPECT_EQ(st.cancelled, static_cast<uint64_t>(n));
  EXPECT_LT(st.generated_tokens, static_cast<uint64_t>(n * max_tokens));
  EXPECT_EQ(st.blocks.free + st.blocks.cached, st.blocks.total);
  EXPECT_EQ(get(s, "/health").status, 200);
}

// Finding 3b: a client that shuts down its sending side after a whole request (`nc -N`) still
// reads its answer; the end of its stream is not a disconnect.
TEST(HttpReview, HalfClosedClientsGetTheirAnswers) {
  TestServer s(tiny_model());
  const auto half_closed = [&](const std::string& request) {
    RawConnection c(s.port);
    EXPECT_TRUE(c.connected());
    c.send(request);
    c.shutdown_write();
    const std::string got = c.read(std::chrono::seconds(10));
    EXPECT_TRUE(c.closed());
    return got;
  };
  std::string got = half_closed("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(got, HasSubstr("HTTP/1.1 200"));
  EXPECT_THAT(got, HasSubstr("\"status\":\"ok\""));

  const json body = {{"prompt", ids(8, 6)}, {"max_tokens", 4}, {"ignore_eos", true}};
  got = half_closed(post_request("/v1/completions", body.dump()));
  EXPECT_THAT(got, HasSubstr("HTTP/1.1 200"));
  EXPECT_THAT(got, HasSubstr("\"finish_reason\":\"length\""));
  EXPECT_THAT(got, HasSubstr("\"completion_tokens\":4"));

  json streamed = body;
  streamed["stream"] = true;
  got = half_closed(post_request("/v1/completions", streamed.dump()));
  EXPECT_THAT(got, HasSubstr("HTTP/1.1 200"));
  EXPECT_THAT(got, HasSubstr("data: [DONE]"));
  EXPECT_EQ(s.engine->stats().cancelled, 0u);
}

// Finding 3a: writing "100 Continue" used to end the body phase, so a body sent slowly after
// it escaped --body-timeout (and eviction).
TEST(HttpReview, ExpectContinueKeepsTheBodyDeadline) {
  ServerOptions so;
  so.transport.body_timeout_s = 0.4;
  TestServer s(tiny_model(), TestServer::default_engine(), so);
  const std::string body = json{{"prompt", "hello there"}}.dump();
  RawConnection slow(s.port);
  ASSERT_TRUE(slow.connected());
  const auto start = Clock::now();
  // The headers alone: the body follows the interim answer.
  const std::string request = post_request("/tokenize", body, "Expect: 100-continue\r\n");
  slow.send(request.substr(0, request.size() - body.size()));
  std::string got = slow.read(std::chrono::seconds(2), "\r\n\r\n");
  EXPECT_THAT(got, HasSubstr("100 Continue"));
  // One byte every 100 ms: each read is quick, the whole body is not.
  for (size_t i = 0; i < body.size() && got.find("408") == std::string::npos && !slow.closed();
       ++i) {
    slow.send(body.substr(i, 1));
    got += slow.read(std::chrono::milliseconds(100));
  }
  got += slow.read(std::chrono::seconds(2), "--body-timeout");
  EXPECT_THAT(got, HasSubstr("HTTP/1.1 408"));
  EXPECT_THAT(got, HasSubstr("--body-timeout"));
  EXPECT_LT(seconds_since(start), 2.0);  // a byte every 100 ms would take 2.5 s to finish
  EXPECT_EQ(get(s, "/health").status, 200);
}

// Finding 9: a known path asked with another method answers 405 with Allow, as vLLM's
// FastAPI does; unknown paths stay 404.
TEST(HttpReview, WrongMethodOnAKnownPathGets405WithAllow) {
  TestServer s(tiny_model());
  auto c = s.client();
  const auto check = [](const httplib::Result& res, const std::string& allow) {
    const testing::Reply r = testing::to_reply(res);
    EXPECT_EQ(r.status, 405) << r.text;
    EXPECT_EQ(r.header("Allow"), allow);
    return r;
  };
  testing::Reply r = check(c.Get("/v1/completions"), "POST");
  expect_error(r, 405, "", "Method Not Allowed");
  EXPECT_EQ(r.body["error"]["code"], "method_not_allowed");
  check(c.Head("/v1/chat/completions"), "POST");
  check(c.Options("/tokenize"), "POST");
  r = check(c.Post("/v1/models", json{{"x", 1}}.dump(), "application/json"), "GET, HEAD");
  expect_error(r, 405, "", "Method Not Allowed");
  check(c.Delete("/v1/cache"), "GET, HEAD");
  check(c.Put("/metrics", "{}", "application/json"), "GET, HEAD");
  // The connection stayed in step: its next request is answered.
  EXPECT_EQ(testing::to_reply(c.Get("/health")).status, 200);
  EXPECT_EQ(get(s, "/nope").status, 404);
  EXPECT_EQ(post(s, "/nope", json::object()).status, 404);
  EXPECT_EQ(get(s, "/nope").body["error"]["type"], "not_found_error");
}

}  // namespace
}  // namespace kvc::server
