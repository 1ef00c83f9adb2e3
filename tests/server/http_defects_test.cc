// The server defects of issue 10, each reproduced over real loopback HTTP: slow clients,
// form-encoded bodies, requests larger than the queue, drain deadlines, tenant privacy of
// /v1/cache, ignored fields, pipelining, and requests at the edge of a tiny KV pool.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "raw_connection.h"
#include "server/chat_template.h"
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
using testing::stream;
using testing::TestServer;
using testing::tiny_model;
using Clock = std::chrono::steady_clock;

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Defect 7: connections that drip their headers hold no thread a whole request needs.
TEST(HttpDefects, SlowClientsDoNotStarveRequestsThatArriveWhole) {
  TestServer s(tiny_model());  // the default connection limits
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < 200; ++i) {
    slow.push_back(std::make_unique<RawConnection>(s.port, "127.0.0.2"));
    ASSERT_TRUE(slow.back()->connected()) << i;
    slow.back()->send("P");
  }
  std::atomic<bool> stop{false};
  std::thread drip([&] {
    const std::string line = "OST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    for (size_t k = 0; !stop; ++k) {
      for (auto& c : slow) c->send(std::string(1, line[k % line.size()]));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = Clock::now();
  const auto r = post(s, "/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 2}});
  const double took = seconds_since(start);
  EXPECT_EQ(r.status, 200) << r.text;
  // A starved request would wait out the slow connections' header deadline; the margin below it
  // keeps the check steady under ThreadSanitizer on a loaded 2-core machine (1.3 s seen there).
  EXPECT_LT(took, TransportOptions{}.header_timeout_s / 4);
  EXPECT_EQ(get(s, "/health").status, 200);
  const ConnectionCounts counts = s.http->connections();
  // Beyond the per-address cap the slow connections were refused at once.
  EXPECT_EQ(counts.refused_per_client, 200 - TransportOptions{}.max_connections_per_client);
  stop = true;
  drip.join();
  size_t refused = 0;
  for (auto& c : slow) {
    if (c->read(std::chrono::milliseconds(1), "\r\n\r\n").find(" 429 ") != std::string::npos) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0u);
}

// Defect 7: a request's headers and body have deadlines, whatever the pace of their bytes.
TEST(HttpDefects, HeadersAndBodiesThatArriveTooSlowlyGet408) {
  ServerOptions so;
  so.transport.header_timeout_s = 0.4;
  so.transport.body_timeout_s = 0.4;
  TestServer s(tiny_model(), TestServer::default_engine(), so);
  {
    RawConnection c(s.port);
    const auto start = Clock::now();
    const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    std::string got;
    for (size_t i = 0; i < request.size() && !c.closed(); ++i) {
      c.send(request.substr(i, 1));
      got += c.read(std::chrono::milliseconds(60));
    }
    EXPECT_THAT(got, HasSubstr("408"));
    EXPECT_THAT(got, HasSubstr("--header-timeout"));
    EXPECT_LT(seconds_since(start), 1.5);
  }
  {
    RawConnection c(s.port);
    const auto start = Clock::now();
    c.send("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"");
    const std::string got = c.read(std::chrono::seconds(3));
    EXPECT_THAT(got, HasSubstr("408"));
    EXPECT_THAT(got, HasSubstr("--body-timeout"));
    EXPECT_LT(seconds_since(start), 1.5);
  }
  EXPECT_EQ(get(s, "/health").status, 200);
}

// Defect 7: at the connection cap a new connection takes the place of an idle one.
TEST(HttpDefects, AtTheConnectionCapIdleConnectionsGiveWay) {
  ServerOptions so;
  so.transport.max_connections = 4;
  so.transport.max_connections_per_client = 0;
  TestServer s(tiny_model(), TestServer::default_engine(), so);
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(std::make_unique<RawConnection>(s.port));
  ASSERT_TRUE(testing::eventually([&] { return s.http->connections().open == 4; }));
  const auto start = Clock::now();
  EXPECT_EQ(get(s, "/health").status, 200);
  EXPECT_LT(seconds_since(start), 1.0);
  EXPECT_GE(s.http->connections().evicted, 1u);
}

// Defect 8: a JSON body sent as a form (`curl -d`) is JSON, at any size under --max-body.
TEST(HttpDefects, FormEncodedBodiesAreReadAsJsonAndSizeErrorsNameTheLimit) {
  ServerOptions so;
  so.max_body_bytes = 64 * 1024;
  TestServer s(tiny_model(), TestServer::default_engine(), so);
  const std::string prompt(20000, 'a');
  const std::string body = json{{"prompt", prompt}, {"max_tokens", 1}}.dump();
  auto c = s.client();
  auto r = testing::to_reply(c.Post("/tokenize", body, "application/x-www-form-urlencoded"));
  EXPECT_EQ(r.status, 200) << r.text;
  const std::string big = json{{"prompt", std::string(70000, 'a')}}.dump();
  r = testing::to_reply(c.Post("/tokenize", big, "application/x-www-form-urlencoded"));
  EXPECT_EQ(r.status, 413);
  EXPECT_THAT(r.text, HasSubstr("65536 bytes"));
  // A chunked body is held to the same limit.
  auto chunked = s.client();
  r = testing::to_reply(chunked.Post(
      "/tokenize", big.size(),
      [&](size_t offset, size_t length, httplib::DataSink& sink) {
        sink.write(big.data() + offset, std::min<size_t>(length, 1000));
        return true;
      },
      "application/json"));
  EXPECT_EQ(r.status, 413);
  EXPECT_THAT(r.text, HasSubstr("65536 bytes"));
}

// Defect 9: a call that could never fit the waiting queue is refused for good.
TEST(HttpDefects, MoreGenerationsThanTheQueueHoldsGet400NotRetryAfter) {
  engine::EngineOptions eo = TestServer::default_engine();
  eo.max_waiting = 4;
  TestServer s(tiny_model(), eo);
  const auto r =
      post(s, "/v1/completions", json{{"prompt", {"a", "b", "c"}}, {"n", 2}, {"max_tokens", 1}});
  EXPECT_EQ(r.status, 400) << r.text;
  EXPECT_THAT(r.text, HasSubstr("--max-waiting"));
  EXPECT_THAT(r.text, HasSubstr("at most 4"));
  EXPECT_EQ(r.header("Retry-After"), "");
  EXPECT_EQ(
      post(s, "/v1/completions", json{{"prompt", {"a", "b"}}, {"n", 2}, {"max_tokens", 1}}).status,
      200);
}

// Defect 10: draining ends at its deadline, streams and idle keep-alive connections included.
TEST(HttpDefects, DrainHonoursItsDeadlineWithStreamingClients) {
  engine::EngineOptions eo = TestServer::default_engine();
  // Each step takes a few milliseconds, so the stream outlasts the drain.
  eo.before_forward = [] { std::this_thread::sleep_for(std::chrono::milliseconds(4)); };
  TestServer s(tiny_model(), eo);
  // A keep-alive connection that has had its answer and sits idle.
  RawConnection idle(s.port);
  idle.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(idle.read(std::chrono::seconds(2), "\r\n\r\n{"), HasSubstr("200"));
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
  const auto start = Clock::now();
  const DrainReport report = s.http->shutdown(0.5);
  const double took = seconds_since(start);
  EXPECT_GE(took, 0.5);
  // Far below the stream's own length (480 steps of 4 ms and more), with room for the sanitizers.
  EXPECT_LT(took, 1.2);
  EXPECT_EQ(report.cancelled, 1u);
  EXPECT_EQ(report.completed, 0u);
  const testing::SseResult r = client.get();
  EXPECT_TRUE(r.done);
  ASSERT_FALSE(r.events.empty());
  EXPECT_EQ(r.events.back()["error"]["code"], "cancelled");
}

// Defect 11: a tenant sees its own figures only; the pool's are the admin's.
TEST(HttpDefects, NonAdminCacheStatsShowOnlyTheTenantsOwnFigures) {
  ServerOptions so;
  so.api_keys = ApiKeys::parse("sk-alice alice admin\nsk-bob bob\n", "keys");
  TestServer s(tiny_model(), TestServer::default_engine(), so);
  ASSERT_EQ(post(s, "/v1/completions", json{{"prompt", ids(40, 1)}, {"max_tokens", 2}}, "sk-alice")
                .status,
            200);
  const auto bob = get(s, "/v1/cache", "sk-bob");
  ASSERT_EQ(bob.status, 200) << bob.text;
  EXPECT_EQ(bob.body["blocks"], json({{"total", s.engine->num_blocks()}}));
  EXPECT_FALSE(bob.body.contains("usage"));
  EXPECT_FALSE(bob.body.contains("prefix_cache"));
  EXPECT_EQ(bob.body["tenant"]["cached_blocks"], 0);
  const auto alice = get(s, "/v1/cache", "sk-alice");
  EXPECT_GT(alice.body["blocks"]["cached"].get<int>(), 0);
  EXPECT_GT(alice.body["tenant"]["cached_blocks"].get<int>(), 0);
}

// Defect 12: fields that used to be accepted and ignored.
TEST(HttpDefects, ModelNamesToolFieldsAndBothMaxTokensAreChecked) {
  TestServer s(tiny_model(), TestServer::default_engine(), {}, false);
  Backend b = Backend::generating(*s.engine);
  b.model_id = "test-model";
  b.served_model_names = {"alias-1", "alias-2"};
  s.http->set_ready(b);
  const json base = {{"prompt", "hi"}, {"max_tokens", 1}};
  for (const char* name : {"test-model", "alias-1", "alias-2"}) {
    json body = base;
    body["model"] = name;
    const auto r = post(s, "/v1/completions", body);
    EXPECT_EQ(r.status, 200) << r.text;
    EXPECT_EQ(r.body["model"], name);
  }
  json wrong = base;
  wrong["model"] = "gpt-4o";
  auto r = post(s, "/v1/completions", wrong);
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body["error"]["code"], "model_not_found");
  EXPECT_EQ(r.body["error"]["type"], "invalid_request_error");
  EXPECT_THAT(r.body["error"]["message"].get<std::string>(), HasSubstr("`gpt-4o` does not exist"));
  const auto models = get(s, "/v1/models");
  ASSERT_EQ(models.body["data"].size(), 3u);
  EXPECT_EQ(models.body["data"][1]["id"], "alias-1");

  const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 1}};
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, json>>{{"functions", json::array({{{"name", "f"}}})},
                                                 {"function_call", "auto"},
                                                 {"tool_choice", "none"},
                                                 {"tools", json::array()}}) {
    json body = chat;
    body[field] = value;
    r = post(s, "/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << field;
    EXPECT_EQ(r.body["error"]["param"], field);
  }
  json both = chat;
  both["max_tokens"] = 0;
  both["max_completion_tokens"] = 2;
  r = post(s, "/v1/chat/completions", both);
  EXPECT_EQ(r.status, 400) << r.text;
  EXPECT_EQ(r.body["error"]["param"], "max_tokens");
}

// Defect 14: pipelined requests are all answered, in order.
TEST(HttpDefects, PipelinedRequestsAreAnsweredInOrder) {
  TestServer s(tiny_model());
  RawConnection c(s.port);
  const std::string tokenize = json{{"prompt", "hello"}}.dump();
  c.send(
      "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
      "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(tokenize.size()) + "\r\n\r\n" + tokenize +
      "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string got = c.read(std::chrono::seconds(5));
  EXPECT_EQ(count_of(got, "HTTP/1.1 200 OK"), 3u) << got;
  const size_t health = got.find("\"status\":\"ok\"");
  const size_t tokens = got.find("\"tokens\"");
  const size_t models = got.find("\"object\":\"list\"");
  ASSERT_NE(health, std::string::npos);
  ASSERT_NE(tokens, std::string::npos);
  ASSERT_NE(models, std::string::npos);
  EXPECT_LT(health, tokens);
  EXPECT_LT(tokens, models);
  EXPECT_TRUE(c.closed());
}

// Defect 1 over HTTP: a 4-block pool answers a request that fills it and the one after, and
// refuses at once one that could never fit, naming both figures.
TEST(HttpDefects, RequestsAtTheEdgeOfATinyPoolAnswerAndTooLargeOnesGet400) {
  KVC_REQUIRE_STORIES(path);
  engine::EngineOptions eo = TestServer::default_engine();
  eo.kv_memory_bytes = 81920;
  eo.block_tokens = 16;
  eo.kv_k_dtype = eo.kv_v_dtype = DType::F32;
  TestServer s(path, eo);
  ASSERT_EQ(s.engine->num_blocks(), 4u);
  auto r = post(s, "/v1/completions",
                json{{"prompt", ids(63, 1)}, {"max_tokens", 1}, {"temperature", 0}});
  EXPECT_EQ(r.status, 200) << r.text;
  r = post(s, "/v1/completions", json{{"prompt", ids(4, 2)}, {"max_tokens", 1}});
  EXPECT_EQ(r.status, 200) << r.text;
  const auto start = Clock::now();
  r = post(s, "/v1/completions", json{{"prompt", ids(70, 3)}, {"max_tokens", 1}});
  EXPECT_LT(seconds_since(start), 1.0);
  EXPECT_EQ(r.status, 400) << r.text;
  const std::string message = r.body["error"]["message"];
  EXPECT_THAT(message, HasSubstr("4 blocks")) << message;
  EXPECT_THAT(message, HasSubstr("5 KV blocks")) << message;
}

// POST /apply-template renders the chat template as text, as llama-server does.
TEST(HttpDefects, ApplyTemplateRendersTheChatTemplate) {
  TestServer s(tiny_model());
  const json messages = {{{"role", "system"}, {"content", "Be brief."}},
                         {{"role", "user"}, {"content", "Hi"}}};
  const auto r = post(s, "/apply-template", json{{"messages", messages}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["prompt"],
            ChatTemplate(ChatFormat::kChatml).render({{"system", "Be brief."}, {"user", "Hi"}}));
  // Without the assistant's turn opened (to render a finished conversation).
  const auto closed =
      post(s, "/apply-template", json{{"messages", messages}, {"add_generation_prompt", false}});
  ASSERT_EQ(closed.status, 200) << closed.text;
  EXPECT_EQ(
      closed.body["prompt"],
      ChatTemplate(ChatFormat::kChatml).render({{"system", "Be brief."}, {"user", "Hi"}}, false));
  EXPECT_EQ(closed.body["prompt"].get<std::string>() + "<|im_start|>assistant\n",
            r.body["prompt"].get<std::string>());
  EXPECT_EQ(
      post(s, "/apply-template", json{{"messages", messages}, {"add_generation_prompt", 1}}).status,
      400);
  EXPECT_EQ(post(s, "/apply-template", json::object()).status, 400);
}

}  // namespace
}  // namespace kvc::server
