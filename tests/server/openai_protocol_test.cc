// Request parsing and validation (every error names its field), response pieces, log-probs
// and the Prometheus writer.
#include "server/openai_protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "server/api_error.h"
#include "server/logprobs.h"
#include "server/metrics.h"
#include "server_fixture.h"

namespace kvc::server {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// The error a body gets: {status, param, message}.
struct Refusal {
  int status = 0;
  std::string param, message;
};

Refusal refusal(const std::string& body, bool chat = false) {
  try {
    parse_completion_request(body, chat);
  } catch (const ApiError& e) {
    return {e.status(), e.param(), e.what()};
  }
  return {};
}

TEST(OpenAiProtocol, ParsesCompletionFields) {
  const CompletionRequest r = parse_completion_request(
      R"({"model": "m", "prompt": "hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
          "n": 2, "stop": "x", "seed": 42, "logprobs": 3, "stream": true,
          "stream_options": {"include_usage": true}, "cache_salt": "s", "user": "u",
          "presence_penalty": 0, "top_k": -1, "ignore_eos": true})",
      false);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(*r.prompts[0].text, "hi");
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 0);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(*r.seed, 42u);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.cache_salt, "s");
  EXPECT_TRUE(r.ignore_eos);
  // OpenAI's defaults.
  const CompletionRequest d = parse_completion_request(R"({"prompt": [1, 2, 3]})", false);
  EXPECT_FLOAT_EQ(d.temperature, 1.0f);
  EXPECT_FLOAT_EQ(d.top_p, 1.0f);
  EXPECT_FALSE(d.max_tokens);
  EXPECT_EQ(d.prompts[0].tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_completion_request(R"({"prompt": ["a", [4, 5]]})", false).prompts.size(), 2u);
}

TEST(OpenAiProtocol, ParsesChatFields) {
  const CompletionRequest r = parse_completion_request(
      R"({"messages": [{"role": "developer", "content": "Be brief."},
                       {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                    {"type": "text", "text": "there"}]}],
          "max_completion_tokens": 9, "max_tokens": 100, "logprobs": true, "top_logprobs": 2,
          "session_id": "conv-1", "stop": ["a", "b"], "response_format": {"type": "text"}})",
      true);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "Hi there");
  EXPECT_EQ(*r.max_tokens, 9);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_EQ(r.session_id, "conv-1");
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
}

TEST(OpenAiProtocol, BadFieldsAreRefusedNamingTheField) {
  const std::vector<std::tuple<std::string, bool, std::string, std::string>> cases = {
      {R"({"prompt": 5})", false, "prompt", "prompt must be"},
      {R"({})", false, "prompt", "prompt is required"},
      {R"({"prompt": []})", false, "prompt", "prompt must be"},
      {R"({"prompt": [1, -2]})", false, "prompt", "non-negative"},
      {R"({"prompt": "x", "max_tokens": "ten"})", false, "max_tokens", "must be an integer"},
      {R"({"prompt": "x", "max_tokens": 0})", false, "max_tokens", "between 1 and"},
      {R"({"prompt": "x", "max_tokens": 2.5})", false, "max_tokens", "must be an integer"},
      {R"({"prompt": "x", "temperature": 3})", false, "temperature", "between 0 and 2, got 3"},
      {R"({"prompt": "x", "temperature": "hot"})", false, "temperature", "must be a number"},
      {R"({"prompt": "x", "top_p": 0})", false, "top_p", "greater than 0"},
      {R"({"prompt": "x", "n": 0})", false, "n", "between 1 and 16"},
      {R"({"prompt": "x", "n": 100})", false, "n", "between 1 and 16"},
      {R"({"prompt": "x", "stream": "yes"})", false, "stream", "must be a boolean"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", false, "stream_options",
       "only allowed when stream is true"},
      {R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})", false,
       "stream_options.include_usage", "must be a boolean"},
      {R"({"prompt": "x", "stop": [1]})", false, "stop", "array of strings"},
      {R"({"prompt": "x", "stop": ""})", false, "stop", "must not be empty"},
      {R"({"prompt": "x", "logprobs": 50})", false, "logprobs", "between 0 and 20"},
      {R"({"prompt": "x", "seed": "s"})", false, "seed", "must be an integer"},
      {R"({"prompt": "x", "frequency_penalty": 1})", false, "frequency_penalty", "not supported"},
      {R"({"prompt": "x", "frequency_penalty": 9})", false, "frequency_penalty", "between -2"},
      {R"({"prompt": "x", "logit_bias": {"1": 5}})", false, "logit_bias", "not supported"},
      {R"({"prompt": "x", "echo": true})", false, "echo", "not supported"},
      {R"({"prompt": "x", "best_of": 3})", false, "best_of", "not supported"},
      {R"({"prompt": "x", "cache_salt": ""})", false, "cache_salt", "1 to 1024"},
      {R"({"prompt": "x", "model": 3})", false, "model", "must be a string"},
      {R"({"prompt": "x", "stop_token_ids": [1.5]})", false, "stop_token_ids", "integer"},
      {R"({"messages": "hi"})", true, "messages", "non-empty array"},
      {R"({"messages": []})", true, "messages", "non-empty array"},
      {R"({"messages": [{"role": "bot", "content": "x"}]})", true, "messages[0].role", "got 'bot'"},
      {R"({"messages": [{"role": "user"}]})", true, "messages[0].content", "required"},
      {R"({"messages": [{"role": "user", "content": 1}]})", true, "messages[0].content",
       "string or an array"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", true,
       "messages[0].content[0].type", "only text parts"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", true,
       "top_logprobs", "needs logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 3})", true, "logprobs",
       "must be a boolean"},
      {R"({"messages": [{"role": "user", "content": "x"}], "session_id": 7})", true, "session_id",
       "must be a string"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{}]})", true, "tools",
       "not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}],
           "response_format": {"type": "json_object"}})",
       true, "response_format", "only response_format"},
  };
  for (const auto& [body, chat, param, message] : cases) {
    const Refusal r = refusal(body, chat);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_EQ(r.param, param) << body;
    EXPECT_THAT(r.message, HasSubstr(message)) << body;
  }
  // Malformed JSON and a non-object body name no field.
  Refusal r = refusal(R"({"prompt": "x",)");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.param, "");
  EXPECT_THAT(r.message, HasSubstr("not valid JSON"));
  r = refusal(R"([1, 2])");
  EXPECT_THAT(r.message, HasSubstr("must be a JSON object, not array"));
}

// A nested value is copied, dumped and rendered by recursion: its depth is bounded at parse.
TEST(OpenAiProtocol, JsonNestedBeyondTheLimitIsRefused) {
  // The body's object is level 1, "messages" 2, the message 3, "x"'s arrays from 4 on.
  const auto nested = [](int levels) {
    const int arrays = levels - 3;
    return R"({"messages": [{"role": "user", "content": "hi", "x": )" + std::string(arrays, '[') +
           std::string(arrays, ']') + "}]}";
  };
  EXPECT_EQ(parse_completion_request(nested(kMaxJsonDepth), true).messages.size(), 1u);
  Refusal r = refusal(nested(kMaxJsonDepth + 1), true);
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.message, HasSubstr("nested deeper than 128 levels"));
  r = refusal(nested(100000), true);
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.message, HasSubstr("nested deeper than 128 levels"));
  // Brackets inside strings are text, not nesting.
  EXPECT_EQ(parse_json_object(R"({"prompt": ")" + std::string(1000, '[') + R"("})").size(), 1u);
}

// nlohmann reports a number beyond a double's range as out_of_range, not as a parse error.
TEST(OpenAiProtocol, NumbersBeyondADoubleAreMalformedJson) {
  for (const char* body :
       {R"({"prompt": "x", "temperature": 1e400})", R"({"prompt": "x", "temperature": -1e400})"}) {
    const Refusal r = refusal(body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_THAT(r.message, HasSubstr("not valid JSON")) << body;
    EXPECT_THAT(r.message, HasSubstr("1e400")) << body;
  }
}

// Sampling values are checked as the sampler's 32-bit floats will hold them, under the API's
// names, before the engine sees them; tiny temperatures are greedy, as in vLLM.
TEST(OpenAiProtocol, SamplingValuesAreCheckedAsTheSamplerHoldsThem) {
  const auto temperature = [](const std::string& t) {
    return parse_completion_request(R"({"prompt": "x", "temperature": )" + t + "}", false)
        .temperature;
  };
  EXPECT_EQ(temperature("1e-45"), 0.0f);
  EXPECT_EQ(temperature("1e-300"), 0.0f);
  EXPECT_EQ(temperature("0.000009"), 0.0f);
  EXPECT_FLOAT_EQ(temperature("0.00001"), 1e-5f);
  EXPECT_FLOAT_EQ(temperature("0.7"), 0.7f);
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, std::string>>{{"top_p", "1e-300"},
                                                        {"top_p", "1e-40"},
                                                        {"repetition_penalty", "1e-300"},
                                                        {"repetition_penalty", "1e-40"},
                                                        {"repetition_penalty", "0"}}) {
    const std::string body = R"({"prompt": "x", ")" + field + R"(": )" + value + "}";
    const Refusal r = refusal(body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_EQ(r.param, field) << body;
    EXPECT_THAT(r.message, HasSubstr(field + " must be greater than 0")) << body;
    EXPECT_THAT(r.message, ::testing::Not(HasSubstr("repeat_penalty"))) << body;
  }
  const CompletionRequest ok = parse_completion_request(
      R"({"prompt": "x", "top_p": 1e-30, "repetition_penalty": 1e-30})", false);
  EXPECT_FLOAT_EQ(ok.top_p, 1e-30f);
  EXPECT_FLOAT_EQ(ok.repetition_penalty, 1e-30f);
}

TEST(OpenAiProtocol, ErrorShapeUsageAndFinishReasons) {
  const ApiError e(400, "invalid_request_error", "bad", "max_tokens");
  EXPECT_EQ(e.to_json(), json::parse(R"({"error": {"message": "bad", "type":
      "invalid_request_error", "param": "max_tokens", "code": null}})"));
  EXPECT_EQ(usage_json(10, 5, 8), json::parse(R"({"prompt_tokens": 10, "completion_tokens": 5,
      "total_tokens": 15, "prompt_tokens_details": {"cached_tokens": 8}})"));
  EXPECT_EQ(openai_finish_reason("eos"), "stop");
  EXPECT_EQ(openai_finish_reason("stop"), "stop");
  EXPECT_EQ(openai_finish_reason("length"), "length");
  EXPECT_EQ(openai_finish_reason("context"), "length");
  EXPECT_EQ(sse_data({{"a", 1}}), "data: {\"a\":1}\n\n");
  // A lone byte of a multi-byte character still serialises.
  EXPECT_EQ(dump_json(json("a\xe2")), "\"a\xef\xbf\xbd\"");
  EXPECT_NE(new_response_id("cmpl-"), new_response_id("cmpl-"));
  EXPECT_EQ(new_response_id("cmpl-").size(), 5u + 24u);
  engine::RequestStats s;
  s.prompt_tokens = 40;
  s.cached_tokens = 32;
  s.miss.kind = kv::MissKind::kDiverged;
  s.miss.at_token = 32;
  s.ttft_ms = 1.23456;
  const json k = kvcache_json(s, 0);
  EXPECT_EQ(k["cached_tokens"], 32);
  EXPECT_EQ(k["miss"]["reason"], "diverged@32");
  EXPECT_EQ(k["miss"]["kind"], "diverged");
  EXPECT_EQ(k["miss"]["at_token"], 32);
  EXPECT_DOUBLE_EQ(k["ttft_ms"].get<double>(), 1.235);
  for (const char* f : {"queue_ms", "e2e_ms", "tpot_ms", "preemptions", "prompt_tokens"}) {
    EXPECT_TRUE(k.contains(f)) << f;
  }
}

TEST(Logprobs, LogSoftmaxAndTopTokens) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f};
  const SampledLogprobs lp = token_logprobs(logits, 2, 3);
  double z = 0;
  for (float x : logits) z += std::exp(x);
  EXPECT_NEAR(lp.chosen.logprob, 2.0 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  // Ties go to the lower id.
  EXPECT_EQ(lp.top[0].id, 1);
  EXPECT_EQ(lp.top[1].id, 3);
  EXPECT_EQ(lp.top[2].id, 2);
  EXPECT_FLOAT_EQ(lp.top[2].logprob, lp.chosen.logprob);
  double total = 0;
  for (int32_t i = 0; i < 4; ++i) total += std::exp(token_logprobs(logits, i, 0).chosen.logprob);
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_TRUE(token_logprobs(logits, 0, 0).top.empty());
  EXPECT_EQ(token_logprobs(logits, 0, 10).top.size(), 4u);
}

// Two byte tokens that are each part of a UTF-8 character both go out as U+FFFD: the legacy
// top_logprobs object keeps one key for them (the likelier token's), not the same key twice.
TEST(Logprobs, CompletionTopLogprobsKeyEachTextOnceAsSent) {
  const auto file = gguf::File::open(testing::tiny_model());
  const model::Tokenizer tokenizer = model::Tokenizer::from_gguf(*file);
  const auto byte_token = [&](int byte) {
    for (int32_t id = 0; id < tokenizer.size(); ++id) {
      if (tokenizer.piece(id) == std::string(1, static_cast<char>(byte))) return id;
    }
    return int32_t{-1};
  };
  const int32_t lead = byte_token(0xE2), continuation = byte_token(0x80);
  ASSERT_GE(lead, 0);
  ASSERT_GE(continuation, 0);
  SampledLogprobs lp;
  lp.chosen = {lead, -0.5f};
  lp.top = {{lead, -0.5f}, {continuation, -1.5f}};
  CompletionLogprobs out;
  out.add(lp, tokenizer, 0);
  const std::string text = dump_json(out.to_json());
  const json parsed = json::parse(text);
  const json& top = parsed["top_logprobs"][0];
  ASSERT_EQ(top.size(), 1u) << text;
  EXPECT_FLOAT_EQ(top.begin().value().get<float>(), -0.5f) << text;
  // The text itself holds the key once: parsers disagree on which of two values they keep.
  const std::string key = "\"" + top.begin().key() + "\":";
  size_t keys = 0;
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) ++keys;
  EXPECT_EQ(keys, 1u) << text;
  EXPECT_EQ(top.begin().key(), "\uFFFD");
}

TEST(PrometheusText, WritesFamiliesTheParserAccepts) {
  PrometheusText p;
  p.family("x_total", "counter", "A counter.");
  p.sample("x_total", {{"tenant", "a\"b\\c\nd"}}, 3);
  p.family("g", "gauge", "A gauge.");
  p.sample("g", {}, 0.25);
  Histogram h({1, 10});
  h.observe(0.5);
  h.observe(5);
  h.observe(50);
  p.histogram("lat_seconds", "Latency.", h.snapshot(), 1e-3);
  EXPECT_THAT(p.text(), HasSubstr("x_total{tenant=\"a\\\"b\\\\c\\nd\"} 3\n"));
  EXPECT_THAT(p.text(), HasSubstr("lat_seconds_bucket{le=\"0.001\"} 1\n"));
  EXPECT_THAT(p.text(), HasSubstr("lat_seconds_bucket{le=\"0.01\"} 2\n"));
  EXPECT_THAT(p.text(), HasSubstr("lat_seconds_bucket{le=\"+Inf\"} 3\n"));
  std::vector<std::string> errors;
  const auto families = testing::parse_prometheus(p.text(), errors);
  EXPECT_THAT(errors, ::testing::IsEmpty());
  EXPECT_EQ(families.at("x_total").samples.at(0).labels.at("tenant"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(families.at("lat_seconds").samples.size(), 5u);
  EXPECT_NEAR(testing::prom_value(families, "lat_seconds_sum"), 0.0555, 1e-12);
  // The parser catches what a scraper would reject.
  testing::parse_prometheus("# TYPE a counter\na 1\nb{x=1} 2\nc 3\n", errors);
  EXPECT_THAT(errors, ::testing::Contains("a has no HELP"));
  EXPECT_THAT(errors, ::testing::Contains("bad sample line: b{x=1} 2"));
  EXPECT_THAT(errors, ::testing::Contains("sample c outside its family (after a)"));
  EXPECT_THAT(errors, ::testing::Contains("c has no TYPE"));
}

}  // namespace
}  // namespace kvc::server
