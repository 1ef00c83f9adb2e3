// The HTTP API over loopback with a real client: every endpoint, the OpenAI response shapes,
// SSE framing, cache figures that match the engine's, and /metrics as Prometheus text.
#include "server/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ctime>

#include "server/chat_template.h"
#include "server_fixture.h"

namespace kvc::server {
namespace {

using testing::get;
using ::testing::HasSubstr;
using testing::ids;
using testing::json;
using testing::post;
using ::testing::StartsWith;
using testing::stream;
using testing::TestServer;
using testing::tiny_model;

std::string completion_text(const json& body) {
  return body["choices"][0]["text"].get<std::string>();
}

TEST(HttpServer, HealthIs503WhileLoadingThen200) {
  TestServer s(tiny_model(), TestServer::default_engine(), {}, false);
  auto r = get(s, "/health");
  EXPECT_EQ(r.status, 503);
  EXPECT_THAT(r.body["error"]["message"].get<std::string>(), HasSubstr("loading"));
  EXPECT_EQ(r.header("Retry-After"), "5");
  r = post(s, "/v1/completions", json{{"prompt", "hi"}});
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body["error"]["code"], "loading");
  s.make_ready();
  r = get(s, "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, json({{"status", "ok"}}));
}

TEST(HttpServer, ModelsListsTheServedModel) {
  TestServer s(tiny_model());
  const auto r = get(s, "/v1/models");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.body["object"], "list");
  ASSERT_EQ(r.body["data"].size(), 1u);
  EXPECT_EQ(r.body["data"][0]["id"], "test-model");
  EXPECT_EQ(r.body["data"][0]["object"], "model");
  EXPECT_EQ(r.body["data"][0]["owned_by"], "kvcache");
  EXPECT_EQ(r.body["data"][0]["max_model_len"], 512);
  EXPECT_TRUE(r.body["data"][0]["created"].is_number_integer());
}

TEST(HttpServer, CompletionHasTheOpenAiShapeAndTheReferenceStory) {
  KVC_REQUIRE_STORIES(path);
  TestServer s(path);
  const auto r = post(s, "/v1/completions",
                      json{{"model", "test-model"},
                           {"prompt", "Once upon a time"},
                           {"max_tokens", 48},
                           {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  const json& b = r.body;
  EXPECT_THAT(b["id"].get<std::string>(), StartsWith("cmpl-"));
  EXPECT_EQ(b["object"], "text_completion");
  EXPECT_NEAR(b["created"].get<double>(), static_cast<double>(std::time(nullptr)), 60);
  EXPECT_EQ(b["model"], "test-model");
  ASSERT_EQ(b["choices"].size(), 1u);
  EXPECT_EQ(b["choices"][0]["index"], 0);
  EXPECT_TRUE(b["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(b["choices"][0]["finish_reason"], "length");
  // The same story `kvcache run` tells (tests/cli): the server adds nothing of its own.
  EXPECT_EQ(completion_text(b),
            ", there was a little girl named Lily. She loved to play outside in the park. One "
            "day, she saw a big, red ball. She wanted to play with it,");
  EXPECT_EQ(b["usage"], json::parse(R"({"prompt_tokens": 5, "completion_tokens": 48,
      "total_tokens": 53, "prompt_tokens_details": {"cached_tokens": 0}})"));
  const json& k = b["kvcache"];
  EXPECT_EQ(k["prompt_tokens"], 5);
  EXPECT_EQ(k["cached_tokens"], 0);
  EXPECT_EQ(k["miss"]["kind"], "cold");
  EXPECT_EQ(k["preemptions"], 0);
  EXPECT_GE(k["e2e_ms"].get<double>(), k["ttft_ms"].get<double>());
  EXPECT_GE(k["ttft_ms"].get<double>(), k["queue_ms"].get<double>());

  // A stop string ends the text before it, with finish_reason "stop".
  const auto stopped = post(s, "/v1/completions",
                            json{{"prompt", "Once upon a time"},
                                 {"max_tokens", 40},
                                 {"temperature", 0},
                                 {"stop", {"girl", "zebra"}}});
  EXPECT_EQ(completion_text(stopped.body), ", there was a little ");
  EXPECT_EQ(stopped.body["choices"][0]["finish_reason"], "stop");
}

TEST(HttpServer, ChatAppliesTheTemplate) {
  KVC_REQUIRE_STORIES(path);
  TestServer s(path);
  const json messages = {{{"role", "system"}, {"content", "Tell stories."}},
                         {{"role", "user"}, {"content", "Once upon a time"}}};
  const auto r = post(s, "/v1/chat/completions",
                      json{{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.text;
  const json& b = r.body;
  EXPECT_THAT(b["id"].get<std::string>(), StartsWith("chatcmpl-"));
  EXPECT_EQ(b["object"], "chat.completion");
  EXPECT_EQ(b["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(b["choices"][0]["message"]["content"].is_string());
  EXPECT_EQ(b["choices"][0]["finish_reason"], "length");
  // The prompt is the chatml rendering (stories260K has no template of its own).
  const auto tokens = post(s, "/tokenize", json{{"messages", messages}});
  const std::vector<int32_t> expected =
      ChatTemplate(ChatFormat::kChatml)
          .apply({{"system", "Tell stories."}, {"user", "Once upon a time"}}, *s.tokenizer);
  EXPECT_EQ(tokens.body["tokens"].get<std::vector<int32_t>>(), expected);
  EXPECT_EQ(b["usage"]["prompt_tokens"], expected.size());
}

// add_generation_prompt false (vLLM's extension) leaves the assistant's turn unopened: the
// prompt is the conversation alone, the tokens the template adds for the turn fewer.
TEST(HttpServer, ChatWithoutTheGenerationPromptLeavesTheAssistantsTurnUnopened) {
  TestServer s(tiny_model());
  const json messages = {{{"role", "user"}, {"content", "Once upon a time"}}};
  const json body = {{"messages", messages}, {"max_tokens", 2}, {"temperature", 0}};
  const auto opened = post(s, "/v1/chat/completions", body);
  json closed_body = body;
  closed_body["add_generation_prompt"] = false;
  const auto closed = post(s, "/v1/chat/completions", closed_body);
  ASSERT_EQ(opened.status, 200) << opened.text;
  ASSERT_EQ(closed.status, 200) << closed.text;
  const ChatTemplate chatml(ChatFormat::kChatml);
  const std::vector<ChatMessage> conversation = {{"user", "Once upon a time"}};
  EXPECT_EQ(opened.body["usage"]["prompt_tokens"], chatml.apply(conversation, *s.tokenizer).size());
  EXPECT_EQ(closed.body["usage"]["prompt_tokens"],
            chatml.apply(conversation, *s.tokenizer, false).size());
  EXPECT_LT(closed.body["usage"]["prompt_tokens"].get<int>(),
            opened.body["usage"]["prompt_tokens"].get<int>());
  closed_body["add_generation_prompt"] = "no";
  const auto bad = post(s, "/v1/chat/completions", closed_body);
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body["error"]["param"], "add_generation_prompt");
}

TEST(HttpServer, StreamedCompletionIsSseEndingWithDoneAndMatchesTheWholeResponse) {
  TestServer s(tiny_model());
  const json body = {
      {"prompt", "Hello there"}, {"max_tokens", 30}, {"temperature", 0}, {"ignore_eos", true}};
  const auto whole = post(s, "/v1/completions", body);
  ASSERT_EQ(whole.status, 200);
  json streaming = body;
  streaming["stream"] = true;
  streaming["stream_options"] = {{"include_usage", true}};
  const testing::SseResult r = stream(s, "/v1/completions", streaming);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_THAT(r.errors, ::testing::IsEmpty());
  EXPECT_TRUE(r.done);
  auto it = r.headers.find("Content-Type");
  ASSERT_NE(it, r.headers.end());
  EXPECT_EQ(it->second, "text/event-stream");
  ASSERT_GE(r.events.size(), 3u);
  std::string text;
  const std::string id = r.events[0]["id"];
  EXPECT_THAT(id, StartsWith("cmpl-"));
  for (size_t i = 0; i + 1 < r.events.size(); ++i) {
    const json& e = r.events[i];
    EXPECT_EQ(e["id"], id);
    EXPECT_EQ(e["object"], "text_completion");
    EXPECT_EQ(e["model"], "test-model");
    EXPECT_TRUE(e["usage"].is_null());
    ASSERT_EQ(e["choices"].size(), 1u);
    text += e["choices"][0]["text"].get<std::string>();
    const bool last = i + 2 == r.events.size();
    EXPECT_EQ(e["choices"][0]["finish_reason"].is_null(), !last);
    EXPECT_EQ(e.contains("kvcache"), last);
  }
  EXPECT_EQ(text, completion_text(whole.body));
  const json& finish = r.events[r.events.size() - 2];
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(finish["kvcache"]["prompt_tokens"], whole.body["usage"]["prompt_tokens"]);
  // With include_usage the last chunk has no choices and the usage of the whole stream.
  const json& usage = r.events.back();
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 30);
  EXPECT_EQ(usage["usage"]["prompt_tokens"], whole.body["usage"]["prompt_tokens"]);
  EXPECT_TRUE(usage["usage"]["prompt_tokens_details"].contains("cached_tokens"));
  EXPECT_TRUE(usage.contains("kvcache"));
  // The wire format itself: "data: " lines separated by blank lines, ending in [DONE].
  EXPECT_THAT(r.raw, StartsWith("data: {"));
  EXPECT_THAT(r.raw, ::testing::EndsWith("\n\ndata: [DONE]\n\n"));
}

TEST(HttpServer, StreamedChatStartsWithTheRoleAndEndsWithTheFinishReason) {
  TestServer s(tiny_model());
  const json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                     {"max_tokens", 10},
                     {"ignore_eos", true},
                     {"stream", true},
                     {"seed", 3}};
  const testing::SseResult r = stream(s, "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_THAT(r.errors, ::testing::IsEmpty());
  EXPECT_TRUE(r.done);
  ASSERT_GE(r.events.size(), 3u);
  EXPECT_EQ(r.events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(r.events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (const json& e : r.events) {
    EXPECT_FALSE(e.contains("usage"));  // only with stream_options.include_usage
    const json& d = e["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
  }
  const json& last = r.events.back();
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["kvcache"]["prompt_tokens"].get<size_t>() > 0, true);
  // The same seed gives the same text, streamed or not.
  json whole = body;
  whole.erase("stream");
  const auto w = post(s, "/v1/chat/completions", whole);
  EXPECT_EQ(w.body["choices"][0]["message"]["content"], text);
}

TEST(HttpServer, SecondRequestReportsTheCachedTokensTheEngineUsed) {
  TestServer s(tiny_model());
  const std::vector<int32_t> a = ids(100, 1);
  auto r = post(s, "/v1/completions", json{{"prompt", a}, {"max_tokens", 4}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  std::vector<int32_t> b = a;
  for (int32_t t : ids(30, 2)) b.push_back(t);
  // What the engine says it would reuse, directly and through /v1/cache/explain.
  const kv::PrefixMatch expected = s.engine->explain(s.engine->namespace_for(""), b);
  ASSERT_GE(expected.cached_tokens, 96u);
  const auto explain = post(s, "/v1/cache/explain", json{{"prompt", b}});
  ASSERT_EQ(explain.status, 200) << explain.text;
  EXPECT_EQ(explain.body["cached_tokens"], expected.cached_tokens);
  EXPECT_EQ(explain.body["would_hit"], true);
  EXPECT_EQ(explain.body["prompt_tokens"], b.size());
  EXPECT_EQ(explain.body["shared_blocks"], expected.shared_blocks);
  const uint64_t before = s.engine->stats().cached_prompt_tokens;
  r = post(s, "/v1/completions", json{{"prompt", b}, {"max_tokens", 4}});
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.body["usage"]["prompt_tokens_details"]["cached_tokens"], expected.cached_tokens);
  EXPECT_EQ(r.body["kvcache"]["cached_tokens"], expected.cached_tokens);
  EXPECT_EQ(s.engine->stats().cached_prompt_tokens - before, expected.cached_tokens);
  EXPECT_EQ(r.body["kvcache"]["miss"]["at_token"], expected.cached_tokens);
}

TEST(HttpServer, SamplesOfOneRequestShareThePromptBlocks) {
  TestServer s(tiny_model());
  const json body = {{"prompt", ids(50, 3)}, {"n", 3},          {"temperature", 1.0},
                     {"seed", 11},           {"max_tokens", 8}, {"ignore_eos", true}};
  const auto r = post(s, "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.text;
  ASSERT_EQ(r.body["choices"].size(), 3u);
  std::set<std::string> texts;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.body["choices"][i]["index"], i);
    texts.insert(r.body["choices"][i]["text"].get<std::string>());
  }
  EXPECT_GT(texts.size(), 1u);
  // The prompt counts once; the later samples read its three full blocks from the cache.
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], 50);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 24);
  const json& k = r.body["kvcache"]["choices"];
  ASSERT_EQ(k.size(), 3u);
  EXPECT_GE(k[1]["cached_tokens"].get<int>(), 48);
  EXPECT_GE(k[2]["cached_tokens"].get<int>(), 48);
  // A fixed seed repeats every sample.
  const auto again = post(s, "/v1/completions", body);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(again.body["choices"][i]["text"], r.body["choices"][i]["text"]);
  }
}

TEST(HttpServer, LogprobsComeFromTheLogits) {
  TestServer s(tiny_model());
  auto r = post(s, "/v1/completions",
                json{{"prompt", "abc"},
                     {"max_tokens", 5},
                     {"temperature", 0},
                     {"logprobs", 3},
                     {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.text;
  const json& lp = r.body["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u);
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  ASSERT_EQ(lp["text_offset"].size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const double chosen = lp["token_logprobs"][i];
    EXPECT_LE(chosen, 0.0);
    double best = -INFINITY;
    for (const auto& [tok, v] : lp["top_logprobs"][i].items())
      best = std::max(best, v.get<double>());
    EXPECT_LE(lp["top_logprobs"][i].size(), 3u);
    // Greedy picks the likeliest token.
    EXPECT_DOUBLE_EQ(chosen, best);
  }
  r = post(s, "/v1/chat/completions",
           json{{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                {"max_tokens", 4},
                {"temperature", 0},
                {"ignore_eos", true},
                {"logprobs", true},
                {"top_logprobs", 2}});
  ASSERT_EQ(r.status, 200) << r.text;
  const json& content = r.body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u);
  for (const json& c : content) {
    ASSERT_EQ(c["top_logprobs"].size(), 2u);
    EXPECT_EQ(c["logprob"], c["top_logprobs"][0]["logprob"]);
    EXPECT_GE(c["top_logprobs"][0]["logprob"], c["top_logprobs"][1]["logprob"]);
    EXPECT_TRUE(c["bytes"].is_array());
    EXPECT_TRUE(c["token"].is_string());
  }
}

TEST(HttpServer, TokenizeAndDetokenize) {
  TestServer s(tiny_model());
  auto r = post(s, "/tokenize", json{{"prompt", "Hello world"}});
  ASSERT_EQ(r.status, 200) << r.text;
  const std::vector<int32_t> expected = s.tokenizer->encode("Hello world", true);
  EXPECT_EQ(r.body["tokens"].get<std::vector<int32_t>>(), expected);
  EXPECT_EQ(r.body["count"], expected.size());
  EXPECT_EQ(r.body["max_model_len"], 512);
  r = post(s, "/tokenize", json{{"content", "Hello world"}, {"add_special", false}});
  EXPECT_EQ(r.body["tokens"].get<std::vector<int32_t>>(),
            s.tokenizer->encode("Hello world", false));
  r = post(s, "/tokenize", json{{"prompt", "Hi"}, {"with_pieces", true}});
  ASSERT_TRUE(r.body["tokens"][0].is_object());
  EXPECT_EQ(r.body["tokens"][0]["id"], s.tokenizer->bos_id());
  EXPECT_TRUE(r.body["tokens"][1]["piece"].is_string());
  r = post(s, "/detokenize", json{{"tokens", expected}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["content"], "Hello world");
  r = post(s, "/detokenize", json{{"tokens", {1, 99999}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["param"], "tokens");
  r = post(s, "/detokenize", json{{"tokens", "x"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["param"], "tokens");
  r = post(s, "/tokenize", json{{"text", "x"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["param"], "prompt");
}

// A server storing q8_0 keys and q4_0 values: a repeated prompt hits the cache and answers the
// same, and /metrics names both types.
TEST(HttpServer, QuantisedKvServesHitsAndShowsBothTypes) {
  engine::EngineOptions eo = TestServer::default_engine();
  eo.kv_k_dtype = DType::Q8_0;
  eo.kv_v_dtype = DType::Q4_0;
  TestServer s(tiny_model(), eo);
  const json body{{"prompt", ids(40, 4)}, {"max_tokens", 8}, {"temperature", 0}};
  const auto first = post(s, "/v1/completions", body);
  const auto second = post(s, "/v1/completions", body);
  ASSERT_EQ(first.status, 200);
  ASSERT_EQ(second.status, 200);
  EXPECT_EQ(first.body["choices"][0]["text"], second.body["choices"][0]["text"]);
  EXPECT_GT(second.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 30);
  const auto m = get(s, "/metrics");
  EXPECT_THAT(m.text, HasSubstr("kv_dtype_k=\"q8_0\""));
  EXPECT_THAT(m.text, HasSubstr("kv_dtype_v=\"q4_0\""));
}

TEST(HttpServer, MetricsAreValidPrometheusTextWithCacheFigures) {
  TestServer s(tiny_model());
  const std::vector<int32_t> p = ids(60, 4);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(post(s, "/v1/completions",
                   json{{"prompt", p}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}})
                  .status,
              200);
  }
  const auto r = get(s, "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  std::vector<std::string> errors;
  const auto f = testing::parse_prometheus(r.text, errors);
  EXPECT_THAT(errors, ::testing::IsEmpty()) << r.text;
  const auto v = [&](const std::string& name, std::map<std::string, std::string> labels = {}) {
    return testing::prom_value(f, name, labels);
  };
  const double free = v("kvcache_kv_blocks", {{"state", "free"}});
  const double cached = v("kvcache_kv_blocks", {{"state", "cached"}});
  const double referenced = v("kvcache_kv_blocks", {{"state", "referenced"}});
  EXPECT_EQ(free + cached + referenced, v("kvcache_kv_blocks_capacity"));
  EXPECT_GT(cached, 0);
  EXPECT_EQ(referenced, 0);
  EXPECT_EQ(v("kvcache_kv_usage_ratio"), 0);
  EXPECT_EQ(v("kvcache_kv_pool_bytes"), static_cast<double>(s.engine->arena_bytes()));
  const engine::EngineStats st = s.engine->stats();
  EXPECT_EQ(v("kvcache_prefix_cache_queried_tokens_total"), st.cache.queried_tokens);
  EXPECT_EQ(v("kvcache_prefix_cache_hit_tokens_total"), st.cache.hit_tokens);
  EXPECT_GE(v("kvcache_prefix_cache_hit_tokens_total"), 48);
  EXPECT_EQ(v("kvcache_tenant_prefix_cache_hit_tokens_total", {{"tenant", "anonymous"}}),
            st.cache.hit_tokens);
  EXPECT_EQ(v("kvcache_tenant_prefix_cache_queried_tokens_total", {{"tenant", "anonymous"}}),
            st.cache.queried_tokens);
  EXPECT_EQ(v("kvcache_prefix_cache_evicted_blocks_total"), 0);
  EXPECT_EQ(v("kvcache_preemptions_total"), 0);
  EXPECT_EQ(v("kvcache_requests_running"), 0);
  EXPECT_EQ(v("kvcache_requests_waiting"), 0);
  EXPECT_EQ(v("kvcache_requests_finished_total"), 2);
  EXPECT_EQ(v("kvcache_http_responses_total", {{"code", "200"}}), 2);
  EXPECT_EQ(
      v("kvcache_info", {{"model", "test-model"}, {"kv_dtype_k", "f16"}, {"kv_dtype_v", "f16"}}),
      1);
  for (const char* h :
       {"kvcache_time_to_first_token_seconds", "kvcache_e2e_request_latency_seconds",
        "kvcache_request_queue_time_seconds"}) {
    ASSERT_TRUE(f.count(h)) << h;
    EXPECT_EQ(f.at(h).type, "histogram");
    EXPECT_EQ(v(std::string(h) + "_count"), 2) << h;
  }
  EXPECT_EQ(v("kvcache_inter_token_latency_seconds_count"), 10);  // 5 gaps per request
}

TEST(HttpServer, CacheStatsExplainPinAndFlush) {
  TestServer s(tiny_model());
  auto r = get(s, "/v1/cache");
  ASSERT_EQ(r.status, 200) << r.text;
  const json& blocks = r.body["blocks"];
  EXPECT_EQ(blocks["total"].get<size_t>(), blocks["free"].get<size_t>() +
                                               blocks["cached"].get<size_t>() +
                                               blocks["referenced"].get<size_t>());
  EXPECT_EQ(r.body["block_tokens"], 16);
  EXPECT_EQ(r.body["prefix_cache_enabled"], true);
  EXPECT_EQ(r.body["tenant"]["name"], "anonymous");
  EXPECT_TRUE(r.body.contains("prefix_cache"));  // without keys the anonymous tenant is admin

  const std::vector<int32_t> p = ids(40, 5);
  r = post(s, "/v1/cache/explain", json{{"prompt", p}});
  EXPECT_EQ(r.body["would_hit"], false);
  EXPECT_EQ(r.body["cached_tokens"], 0);
  EXPECT_EQ(r.body["miss"]["kind"], "cold");
  // Pinning a prefix that is not cached computes it first.
  r = post(s, "/v1/cache/pin", json{{"prompt", p}, {"ttl_seconds", 60}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["warmed"], true);
  EXPECT_EQ(r.body["pinned_tokens"], 32);  // its two full blocks
  EXPECT_EQ(r.body["prompt_tokens"], 40);
  r = post(s, "/v1/cache/explain", json{{"prompt", p}});
  EXPECT_EQ(r.body["would_hit"], true);
  EXPECT_EQ(r.body["miss"]["kind"], "none");
  EXPECT_EQ(r.body["cached_tokens"], 39);  // the last prompt token is always recomputed
  r = post(s, "/v1/cache/pin", json{{"prompt", p}, {"ttl_seconds", 60}});
  EXPECT_EQ(r.body["warmed"], false);
  r = post(s, "/v1/cache/flush", json::object());
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_GE(r.body["flushed_blocks"].get<int>(), 3);
  r = post(s, "/v1/cache/explain", json{{"prompt", p}});
  EXPECT_EQ(r.body["cached_tokens"], 0);
  EXPECT_EQ(r.body["miss"]["kind"], "evicted");
  EXPECT_EQ(s.engine->stats().blocks.free, s.engine->stats().blocks.total);
  // Pin's own fields are checked like any other.
  r = post(s, "/v1/cache/pin", json{{"prompt", p}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["param"], "ttl_seconds");
  r = post(s, "/v1/cache/pin", json{{"prompt", p}, {"ttl_seconds", 5}, {"tenant", "carol"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["param"], "tenant");
}

TEST(HttpServer, SessionKeepsTheConversationForTheNextTurn) {
  TestServer s(tiny_model());
  json messages = {
      {{"role", "system"}, {"content", "You are a helpful assistant who tells stories."}},
      {{"role", "user"}, {"content", "Tell me about the sea."}}};
  auto r = post(s, "/v1/chat/completions",
                json{{"messages", messages},
                     {"max_tokens", 8},
                     {"session_id", "conv-1"},
                     {"ignore_eos", true},
                     {"seed", 1}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(s.engine->stats().sessions, 1u);
  const size_t first_prompt = r.body["usage"]["prompt_tokens"];
  messages.push_back(
      {{"role", "assistant"}, {"content", r.body["choices"][0]["message"]["content"]}});
  messages.push_back({{"role", "user"}, {"content", "And then?"}});
  r = post(s, "/v1/chat/completions",
           json{{"messages", messages}, {"max_tokens", 4}, {"session_id", "conv-1"}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_GE(r.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<size_t>(),
            first_prompt / 16 * 16 - 16);
  EXPECT_GT(r.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<size_t>(), 0u);
}

}  // namespace
}  // namespace kvc::server
