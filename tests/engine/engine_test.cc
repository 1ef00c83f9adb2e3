// The engine under load: exactness against solo runs, preemption, cancellation, overload,
// oversize requests, sessions, priorities and stop conditions.
#include "engine/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <stdexcept>

#include "engine/engine_fixture.h"
#include "model/sampler.h"
#include "reference_generator.h"
#include "test_models.h"

namespace kvc::engine {
namespace {

using kvc::testing::CacheContext;
using kvc::testing::GenerationOptions;
using kvc::testing::GenerationStats;
using kvc::testing::Generator;

using ::testing::HasSubstr;

// Requests run concurrently, batched, chunked and preempted under a pool too small for all of
// them, with keys and values of the given types in blocks of block_tokens (pool_blocks of
// them), each gets the tokens and logits of a solo run.
void expect_engine_matches_solo_runs(DType k_dtype, DType v_dtype, int block_tokens,
                                     size_t pool_blocks, size_t shared_tokens) {
  SCOPED_TRACE(::testing::Message() << dtype_name(k_dtype) << "/" << dtype_name(v_dtype));
  Loaded m(model_path());
  const int n_vocab = m.model->config().n_vocab;
  EngineOptions o;
  o.kv_k_dtype = k_dtype;
  o.kv_v_dtype = v_dtype;
  o.block_tokens = block_tokens;
  o.threads = 2;
  o.max_batch_tokens = 24;  // prefills arrive in chunks, mixed with decodes
  o.max_running = 6;
  const kv::KvGeometry g = m.model->config().kv_geometry(k_dtype, v_dtype, block_tokens);
  o.kv_memory_bytes = g.bytes_per_block() * pool_blocks;
  Engine engine(*m.model, *m.tokenizer, o);
  model::Rng rng(99);
  const auto shared = random_prompt(rng, n_vocab, shared_tokens);
  std::vector<Request> requests;
  for (int i = 0; i < 12; ++i) {
    auto p = (i % 3 == 0) ? random_prompt(rng, n_vocab, 20 + i) : shared;
    const auto tail = random_prompt(rng, n_vocab, 2 + i % 5);
    p.insert(p.end(), tail.begin() + 1, tail.end());
    Request r = greedy(p, 40);
    r.record_logits = true;
    r.ns = engine.namespace_for("");
    r.priority = i % 4 == 1 ? 1 : 0;
    requests.push_back(r);
  }
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const auto& r : requests) handles.push_back(engine.submit(r));
  std::vector<Outcome> outcomes;
  for (auto& h : handles) outcomes.push_back(collect(*h));

  kv::BlockPool solo_pool(g, g.bytes_per_block() * 64);
  ThreadPool threads(1);
  Generator solo(*m.model, solo_pool, threads);
  int preemptions = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(outcomes[i].error, "");
    preemptions += outcomes[i].stats.preemptions;
    GenerationOptions go;
    go.max_tokens = 40;
    go.sampling.temperature = 0.0f;
    go.stop_at_eos = false;
    std::vector<std::vector<float>> logits;
    go.on_logits = [&](std::span<const float> l) { logits.emplace_back(l.begin(), l.end()); };
    std::vector<int32_t> tokens;
    solo.generate(requests[i].prompt, go, [&](int32_t t) {
      tokens.push_back(t);
      return true;
    });
    EXPECT_EQ(outcomes[i].tokens, tokens) << "request " << i;
    ASSERT_EQ(outcomes[i].logits.size(), logits.size());
    for (size_t k = 0; k < logits.size(); ++k) {
      ASSERT_EQ(0, std::memcmp(outcomes[i].logits[k].data(), logits[k].data(),
                               logits[k].size() * sizeof(float)))
          << "request " << i << " step " << k;
    }
    EXPECT_EQ(outcomes[i].stats.finish_reason, FinishReason::kLength);
  }
  EXPECT_GT(preemptions, 0) << "the pool was meant to be too small for all at once";
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.blocks.referenced, 0u);
  EXPECT_GT(s.cached_prompt_tokens, 0u);
  engine.flush_cache();
  EXPECT_EQ(engine.stats().blocks.free, engine.num_blocks());  // no leaks
}

TEST(Engine, ConcurrentBatchedChunkedPreemptedRequestsMatchSoloRuns) {
  // 30 blocks of 8 tokens: six ~70-token sequences cannot all fit, so some are preempted.
  expect_engine_matches_solo_runs(DType::F16, DType::F16, 8, 30, 30);
  // Keys grouped per channel: 32-token blocks, each running sequence also holding its open
  // keys (one block), 14 blocks for six sequences of about 4 blocks.
  expect_engine_matches_solo_runs(DType::Q8_0, DType::Q4_0, 32, 14, 40);
}

TEST(Engine, ExhaustedPoolStillFinishesEveryLongRequest) {
  Loaded m(testing::synthetic_model_path("tiny", DType::Q8_0));
  EngineOptions o;
  o.block_tokens = 16;
  o.threads = 1;
  o.max_running = 8;
  o.kv_memory_bytes =
      m.model->config().kv_geometry(DType::F16, DType::F16, 16).bytes_per_block() * 24;
  Engine engine(*m.model, *m.tokenizer, o);
  model::Rng rng(3);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 10; ++i) {
    handles.push_back(engine.submit(greedy(random_prompt(rng, 512, 40), 200)));
  }
  for (auto& h : handles) {
    const Outcome out = collect(*h);
    EXPECT_EQ(out.stats.generated_tokens, 200u);
    EXPECT_EQ(out.error, "");
  }
  EXPECT_GT(engine.stats().preemptions, 0u);
  engine.flush_cache();
  EXPECT_EQ(engine.stats().blocks.free, engine.num_blocks());
}

TEST(Engine, CancelStopsWithinAStepAndFreesBlocks) {
  Loaded m(testing::synthetic_model_path("tiny", DType::F32));
  EngineOptions o;
  o.threads = 1;
  o.prefix_cache = false;
  Engine engine(*m.model, *m.tokenizer, o);
  auto h = engine.submit(greedy({1, 5, 6, 7}, 400));
  TokenEvent e;
  ASSERT_TRUE(h->next(e));
  h->cancel();
  const Outcome out = collect(*h);
  EXPECT_EQ(out.stats.finish_reason, FinishReason::kCancelled);
  EXPECT_LT(out.stats.generated_tokens, 400u);
  EXPECT_EQ(engine.stats().blocks.free, engine.num_blocks());
}

TEST(Engine, OverloadAndOversizeAreClearErrors) {
  Loaded m(testing::synthetic_model_path("tiny", DType::F32));
  EngineOptions o;
  o.threads = 1;
  o.max_running = 1;
  o.max_waiting = 2;
  o.kv_memory_bytes =
      m.model->config().kv_geometry(DType::F16, DType::F16, 16).bytes_per_block() * 8;
  Engine engine(*m.model, *m.tokenizer, o);
  const auto too_long = [&] {
    std::vector<int32_t> p(600, 5);
    engine.submit(greedy(p, 4));
  };
  EXPECT_THAT(too_long, ::testing::ThrowsMessage<RequestError>(
                            HasSubstr("the prompt has 600 tokens but the context holds 512")));
  EXPECT_THAT(
      [&] {
        engine.submit(greedy({1, 2, 3}, 300));
      },
      ::testing::ThrowsMessage<RequestError>(HasSubstr("needs 19 KV blocks")));
  try {
    engine.submit(greedy({1, 2, 3}, 300));
  } catch (const RequestError& e) {
    EXPECT_EQ(e.kind(), RequestErrorKind::kTooLarge);
    EXPECT_THAT(e.what(), HasSubstr("pool has 8 blocks"));
  }
  EXPECT_THROW(engine.submit(greedy({}, 4)), RequestError);
  EXPECT_THROW(engine.submit(greedy({1, 99999}, 4)), RequestError);
  // One running, two waiting: the next is refused as overloaded.
  std::vector<std::shared_ptr<RequestHandle>> held;
  bool overloaded = false;
  for (int i = 0; i < 8 && !overloaded; ++i) {
    try {
      held.push_back(engine.submit(greedy({1, 2, 3}, 100)));
    } catch (const RequestError& e) {
      overloaded = e.kind() == RequestErrorKind::kOverloaded;
      EXPECT_THAT(e.what(), HasSubstr("overloaded"));
    }
  }
  EXPECT_TRUE(overloaded);
  for (auto& h : held) h->cancel();
  for (auto& h : held) collect(*h);
  EXPECT_GE(engine.stats().rejected_overloaded, 1u);
}

TEST(Engine, RequestsSubmittedTogetherArriveTogetherOrNotAtAll) {
  Loaded m(testing::synthetic_model_path("tiny", DType::F32));
  EngineOptions o;
  o.threads = 1;
  o.max_running = 4;
  o.max_waiting = 3;
  o.kv_memory_bytes =
      m.model->config().kv_geometry(DType::F16, DType::F16, 16).bytes_per_block() * 16;
  Engine engine(*m.model, *m.tokenizer, o);
  const auto group = [](size_t n, std::vector<int32_t> last_prompt) {
    std::vector<Request> requests;
    for (size_t i = 0; i + 1 < n; ++i) requests.push_back(greedy({1, 2, 3, int32_t(4 + i)}, 1));
    requests.push_back(greedy(std::move(last_prompt), 1));
    return requests;
  };
  // More than the waiting queue holds, or one invalid request: none of the group is queued.
  EXPECT_THAT(
      [&] {
        engine.submit_all(group(4, {1, 2}));
      },
      ::testing::ThrowsMessage<RequestError>(
          HasSubstr("0 requests are already waiting, no room for 4 more")));
  EXPECT_THAT(
      [&] {
        engine.submit_all(group(3, {1, 99999}));
      },
      ::testing::ThrowsMessage<RequestError>(HasSubstr("outside the vocabulary")));
  EXPECT_EQ(engine.stats().submitted, 0u);
  // A group the step thread sees at once: one forward pass prefills all three.
  std::vector<Outcome> outcomes;
  for (auto& h : engine.submit_all(group(3, {1, 2, 9}))) outcomes.push_back(collect(*h));
  for (const Outcome& out : outcomes) EXPECT_EQ(out.stats.generated_tokens, 1u);
  EXPECT_EQ(engine.stats().submitted, 3u);
  EXPECT_EQ(engine.stats().steps, 1u);
}

TEST(Engine, SessionTurnsReuseThePreviousContext) {
  Loaded m(model_path());
  EngineOptions o;
  o.threads = 2;
  o.block_tokens = 16;
  o.kv_memory_bytes =
      m.model->config().kv_geometry(DType::F16, DType::F16, 16).bytes_per_block() * 40;
  Engine engine(*m.model, *m.tokenizer, o);
  const kv::Hash256 ns = engine.namespace_for("");
  model::Rng rng(8);
  const int n_vocab = m.model->config().n_vocab;
  std::vector<int32_t> conversation = random_prompt(rng, n_vocab, 37);
  for (int turn = 0; turn < 4; ++turn) {
    Request r = greedy(conversation, 20);
    r.session_id = "chat-1";
    r.ns = ns;
    const Outcome out = collect(*engine.submit(r));
    if (turn > 0) {
      // Everything before this turn's new tokens was cached, to the block at least.
      EXPECT_GE(out.stats.cached_tokens, (conversation.size() - 9) / 16 * 16) << turn;
    }
    conversation.insert(conversation.end(), out.tokens.begin(), out.tokens.end());
    const auto question = random_prompt(rng, n_vocab, 9);
    conversation.insert(conversation.end(), question.begin() + 1, question.end());
    // Other traffic between turns presses on the pool; the session's pins hold.
    for (int i = 0; i < 3; ++i)
      collect(*engine.submit(greedy(random_prompt(rng, n_vocab, 150), 8)));
  }
  EXPECT_EQ(engine.stats().sessions, 1u);
  EXPECT_TRUE(engine.close_session("chat-1"));
  EXPECT_FALSE(engine.close_session("chat-1"));
  EXPECT_EQ(engine.stats().sessions, 0u);
}

TEST(Engine, HigherPriorityIsAdmittedFirst) {
  Loaded m(testing::synthetic_model_path("tiny", DType::F32));
  EngineOptions o;
  o.threads = 1;
  o.max_running = 1;
  Engine engine(*m.model, *m.tokenizer, o);
  auto first = engine.submit(greedy({1, 2, 3}, 60));  // occupies the only slot
  auto low = engine.submit(greedy({1, 4, 5}, 5));
  Request urgent = greedy({1, 6, 7}, 5);
  urgent.priority = 5;
  auto high = engine.submit(urgent);
  const Outcome h = collect(*high), l = collect(*low);
  collect(*first);
  EXPECT_LT(h.stats.queue_ms, l.stats.queue_ms);
}

TEST(Engine, FinishReasons) {
  Loaded m(model_path());
  EngineOptions o;
  o.threads = 1;
  Engine engine(*m.model, *m.tokenizer, o);
  const auto prompt = m.tokenizer->encode("Once upon a time", true);
  Request r = greedy(prompt, 5);
  EXPECT_EQ(collect(*engine.submit(r)).stats.finish_reason, FinishReason::kLength);
  if (!testing::stories_model_path().empty()) {
    r.max_tokens = 100;
    r.stop = {"girl"};
    const Outcome stopped = collect(*engine.submit(r));
    EXPECT_EQ(stopped.stats.finish_reason, FinishReason::kStop);
    EXPECT_EQ(stopped.text, ", there was a little ");
    EXPECT_EQ(stopped.stats.stop_string, "girl");
  }
  // Random weights give end-of-sequence a 1-in-512 chance per sampled token: some seed ends
  // early, and that seed always does.
  Loaded tiny(testing::synthetic_model_path("tiny", DType::F32));
  Engine tiny_engine(*tiny.model, *tiny.tokenizer, o);
  bool saw_eos = false;
  for (uint64_t seed = 1; seed <= 30 && !saw_eos; ++seed) {
    Request sampled = greedy({1, 40, 41}, 400);
    sampled.ignore_eos = false;
    sampled.sampling = {1.0f, 0, 1.0f, 0.0f, 1.0f, 64, seed};
    const Outcome out = collect(*tiny_engine.submit(sampled));
    if (out.stats.finish_reason != FinishReason::kEos) continue;
    saw_eos = true;
    EXPECT_EQ(out.tokens.back(), tiny.tokenizer->eos_id());
    EXPECT_EQ(out.stats.generated_tokens, out.tokens.size());
  }
  EXPECT_TRUE(saw_eos);
  // A stop token ends the request like a stop string: its text is not shown.
  Request until_token = greedy({1, 40, 41}, 30);
  const Outcome free_run = collect(*tiny_engine.submit(until_token));
  ASSERT_GE(free_run.tokens.size(), 4u);
  until_token.stop_tokens = {free_run.tokens[3]};
  const Outcome stopped_at_token = collect(*tiny_engine.submit(until_token));
  EXPECT_EQ(stopped_at_token.stats.finish_reason, FinishReason::kStop);
  const size_t first = static_cast<size_t>(
      std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[3]) -
      free_run.tokens.begin());
  EXPECT_EQ(stopped_at_token.tokens.size(), first + 1);
  until_token.stop_tokens = {tiny.model->config().n_vocab};
  EXPECT_THROW(tiny_engine.submit(until_token), RequestError);
  Request near_end = greedy(std::vector<int32_t>(tiny.model->config().context_length - 3, 5), 50);
  EXPECT_EQ(collect(*tiny_engine.submit(near_end)).stats.finish_reason, FinishReason::kContext);
}

// Defect: a stop token ended a request without the text held back in case it began a stop
// string (" little" for a stop string " littleZZ"): the reply lost its last words.
TEST(Engine, AStopTokenKeepsTheTextHeldBackForAStopString) {
  if (testing::stories_model_path().empty()) {
    GTEST_SKIP() << "needs the stories model (KVCACHE_TEST_MODEL): its text is known";
  }
  Loaded m(model_path());
  EngineOptions o;
  o.threads = 1;
  Engine engine(*m.model, *m.tokenizer, o);
  Request r = greedy(m.tokenizer->encode("Once upon a time", true), 12);
  const Outcome free_run = collect(*engine.submit(r));  // ", there was a little girl ..."
  ASSERT_GE(free_run.tokens.size(), 6u);
  std::string before;  // the first five tokens' text
  for (size_t i = 0; i < 5; ++i) before += m.tokenizer->piece(free_run.tokens[i]);
  ASSERT_EQ(free_run.text.substr(0, before.size()), before);
  r.stop_tokens = {free_run.tokens[5]};
  r.stop = {m.tokenizer->piece(free_run.tokens[4]) + "ZZ"};
  const Outcome stopped = collect(*engine.submit(r));
  EXPECT_EQ(stopped.stats.finish_reason, FinishReason::kStop);
  EXPECT_EQ(stopped.text, before);
  EXPECT_EQ(stopped.stats.stop_string, "");
}

// A step that throws (a bug, memory running out) once ended the step thread and the process:
// it ends the requests it held with an error naming the cause, and the engine serves on.
TEST(Engine, AStepThatThrowsFailsItsRequestsAndTheEngineGoesOn) {
  Loaded m(testing::synthetic_model_path("tiny", DType::F32));
  EngineOptions o;
  o.threads = 1;
  std::atomic<int> throws_left{1};
  o.before_forward = [&] {
    if (throws_left.fetch_sub(1) > 0) throw std::runtime_error("scratch allocation failed");
  };
  Engine engine(*m.model, *m.tokenizer, o);
  const Outcome failed = collect(*engine.submit(greedy({1, 40, 41}, 4)));
  EXPECT_EQ(failed.stats.finish_reason, FinishReason::kError);
  EXPECT_NE(failed.error.find("scratch allocation failed"), std::string::npos) << failed.error;
  const Outcome next = collect(*engine.submit(greedy({1, 40, 41}, 4)));
  EXPECT_EQ(next.error, "");
  EXPECT_EQ(next.stats.finish_reason, FinishReason::kLength);
  EXPECT_EQ(next.tokens.size(), 4u);
  EXPECT_EQ(engine.stats().blocks.referenced, 0u);
}

TEST(Engine, ShutdownDrainsThenCancels) {
  Loaded m(testing::synthetic_model_path("tiny", DType::F32));
  EngineOptions o;
  o.threads = 1;
  auto engine = std::make_unique<Engine>(*m.model, *m.tokenizer, o);
  auto quick = engine->submit(greedy({1, 2}, 3));
  auto slow = engine->submit(greedy({1, 3}, 400));
  engine->shutdown(0);
  EXPECT_TRUE(quick->finished());
  EXPECT_TRUE(slow->finished());
  EXPECT_THROW(engine->submit(greedy({1, 2}, 3)), RequestError);
}

}  // namespace
}  // namespace kvc::engine
