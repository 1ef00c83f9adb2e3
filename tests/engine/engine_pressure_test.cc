// The engine under memory pressure and hostile use: every accepted request runs, the thread
// sleeps when it cannot progress, pins and sessions give way before running requests, pins
// compose, cache operations never wait for compute, and namespaces do not pile up.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "engine/engine_fixture.h"
#include "test_models.h"

namespace kvc::engine {
namespace {

using ::testing::HasSubstr;

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

uint64_t block_bytes(const Loaded& m, int block_tokens = 16) {
  return m.model->config().kv_geometry(DType::F16, DType::F16, block_tokens).bytes_per_block();
}

// Waits for a request's end, failing (not hanging) after `seconds`.
Outcome collect_within(const std::shared_ptr<RequestHandle>& h, double seconds) {
  auto done = std::async(std::launch::async, [h] { return collect(*h); });
  if (done.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    h->cancel();
    ADD_FAILURE() << "request " << h->id() << " did not end within " << seconds << " s";
  }
  return done.get();
}

// Defect: a prompt needing every block was accepted, but admission also wanted a reserve
// block, so it never ran and blocked everything behind it.
TEST(EnginePressure, AnAcceptedRequestAlwaysRuns) {
  Loaded m(testing::synthetic_model_path("tiny", DType::F32));
  EngineOptions o;
  o.threads = 1;
  o.kv_memory_bytes = block_bytes(m) * 4;  // 4 blocks of 16 tokens
  Engine engine(*m.model, *m.tokenizer, o);
  model::Rng rng(1);
  auto full = engine.submit(greedy(random_prompt(rng, 512, 63), 1));  // needs all 4 blocks
  auto small = engine.submit(greedy(random_prompt(rng, 512, 4), 4));
  const Outcome a = collect_within(full, 10);
  const Outcome b = collect_within(small, 10);
  EXPECT_EQ(a.error, "");
  EXPECT_EQ(a.stats.generated_tokens, 1u);
  EXPECT_EQ(b.stats.generated_tokens, 4u);
  // One that could never fit is refused at once, naming both figures.
  try {
    engine.submit(greedy(random_prompt(rng, 512, 63), 2));
    ADD_FAILURE() << "a 65-token request was accepted by a 64-token pool";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.kind(), RequestErrorKind::kTooLarge);
    EXPECT_THAT(e.what(), HasSubstr("needs 5 KV blocks"));
    EXPECT_THAT(e.what(), HasSubstr("pool has 4 blocks"));
  }
}

// Defect: the engine thread polled at 79% CPU while a request waited; it must sleep.
TEST(EnginePressure, TheEngineThreadSleepsWhenIdle) {
  Loaded m(testing::synthetic_model_path("tiny", DType::F32));
  EngineOptions o;
  o.threads = 1;
  Engine engine(*m.model, *m.tokenizer, o);
  model::Rng rng(2);
  collect(*engine.submit(greedy(random_prompt(rng, 512, 8), 4)));
  const double before = cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_LT(cpu_seconds() - before, 0.05) << "the process used CPU while the engine was idle";
  // ... and wakes at once for a cancellation of a waiting request.
  o.max_running = 1;
  Engine one(*m.model, *m.tokenizer, o);
  auto running = one.submit(greedy(random_prompt(rng, 512, 8), 400));
  auto waiting = one.submit(greedy(random_prompt(rng, 512, 8), 4));
  waiting->cancel();
  EXPECT_EQ(collect_within(waiting, 2).stats.finish_reason, FinishReason::kCancelled);
  running->cancel();
  collect_within(running, 2);
}

// Defect: sessions pinned the pool full, then running requests preempted each other thousands
// of times. Pinned and session blocks now give way first, preemptions are bounded, and a small
// request is still served promptly.
TEST(EnginePressure, PinnedSessionsGiveWayBeforeAnyPreemption) {
  Loaded m(testing::synthetic_model_path("tiny", DType::F32));
  EngineOptions o;
  o.threads = 2;
  o.max_running = 16;
  o.kv_memory_bytes = block_bytes(m) * 48;
  o.session_max_blocks = 64;
  o.tenant_pinned_max_blocks = 48;  // let one tenant pin the whole pool, the worst case
  Engine engine(*m.model, *m.tokenizer, o);
  const kv::Hash256 ns = engine.namespace_for("");
  model::Rng rng(3);
  for (int i = 0; i < 8; ++i) {
    Request r = greedy(random_prompt(rng, 512, 90), 2);
    r.ns = ns;
    r.session_id = "s" + std::to_string(i);
    collect(*engine.submit(r));
  }
  const EngineStats pinned = engine.stats();
  EXPECT_EQ(pinned.sessions, 8u);
  EXPECT_GT(pinned.blocks.pinned, 24u);
  EXPECT_EQ(
      pinned.blocks.free + pinned.blocks.cached + pinned.blocks.pinned + pinned.blocks.referenced,
      pinned.blocks.total);
  // Sixteen samples of one prompt (as n=16), then a 5-token request in the middle.
  const auto prompt = random_prompt(rng, 512, 40);
  std::vector<std::shared_ptr<RequestHandle>> many;
  for (int i = 0; i < 16; ++i) {
    Request r = greedy(prompt, 60);
    r.ns = ns;
    many.push_back(engine.submit(r));
  }
  const auto t0 = std::chrono::steady_clock::now();
  Request small = greedy(random_prompt(rng, 512, 5), 5);
  small.ns = ns;
  const Outcome s = collect_within(engine.submit(small), 10);
  const double small_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.stats.generated_tokens, 5u);
  EXPECT_LT(small_s, 2.0);
  for (auto& h : many) {
    const Outcome out = collect_within(h, 60);
    EXPECT_EQ(out.error, "");
    EXPECT_EQ(out.stats.generated_tokens, 60u);
    EXPECT_LE(out.stats.preemptions, o.max_preemptions + 1);
  }
  EXPECT_LT(engine.stats().preemptions, 100u);
  EXPECT_EQ(engine.stats().blocks.referenced, 0u);
}

// One tenant's sessions may pin at most its allowance of the pool (a quarter by default).
TEST(EnginePressure, ATenantsPinnedBlocksAreCapped) {
  Loaded m(testing::synthetic_model_path("tiny", DType::F32));
  EngineOptions o;
  o.threads = 1;
  o.kv_memory_bytes = block_bytes(m) * 40;
  Engine engine(*m.model, *m.tokenizer, o);
  EXPECT_EQ(engine.tenant_pinned_max_blocks(), 10u);
  const kv::Hash256 ns = engine.namespace_for("greedy-tenant");
  model::Rng rng(4);
  for (int i = 0; i < 6; ++i) {
    Request r = greedy(random_prompt(rng, 512, 60), 2);
    r.ns = ns;
    r.session_id = "t" + std::to_string(i);
    collect(*engine.submit(r));
  }
  EXPECT_LE(engine.namespace_stats(ns).pinned_blocks, 10u);
  EXPECT_GT(engine.namespace_stats(ns).pinned_blocks, 0u);
}

// Defect: a session ending unpinned an admin's pin of the same shared system prompt.
TEST(EnginePressure, ASessionEndingLeavesOtherPins) {
  Loaded m(testing::synthetic_model_path("tiny", DType::F32));
  EngineOptions o;
  o.threads = 1;
  Engine engine(*m.model, *m.tokenizer, o);
  const kv::Hash256 ns = engine.namespace_for("");
  model::Rng rng(5);
  const auto system = random_prompt(rng, 512, 48);
  Request warm = greedy(system, 1);
  warm.ns = ns;
  collect(*engine.submit(warm));
  EXPECT_EQ(engine.pin(ns, system, 3600e3).tokens, 48u);
  auto turn = system;
  const auto tail = random_prompt(rng, 512, 10);
  turn.insert(turn.end(), tail.begin() + 1, tail.end());
  Request r = greedy(turn, 2);
  r.ns = ns;
  r.session_id = "chat";
  collect(*engine.submit(r));
  EXPECT_TRUE(engine.close_session("chat"));
  EXPECT_EQ(engine.namespace_stats(ns).pinned_blocks, 3u);  // the admin's 48 tokens
}

// Defect: the state lock was held for the whole forward pass, so stats, explain and pin waited
// behind compute. They must complete while a forward pass is in progress.
TEST(EnginePressure, CacheOperationsNeverWaitForAForwardPass) {
  Loaded m(testing::synthetic_model_path("tiny", DType::F32));
  std::mutex mu;
  std::condition_variable cv;
  bool in_forward = false, released = false;
  EngineOptions o;
  o.threads = 1;
  o.before_forward = [&] {
    std::unique_lock lock(mu);
    in_forward = true;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(10), [&] { return released; });
  };
  Engine engine(*m.model, *m.tokenizer, o);
  const kv::Hash256 ns = engine.namespace_for("");
  model::Rng rng(6);
  const auto prompt = random_prompt(rng, 512, 40);
  Request r = greedy(prompt, 2);
  r.ns = ns;
  auto h = engine.submit(r);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return in_forward; }));
  }
  // The engine thread is now inside its step, about to compute: all of these must return.
  auto ops = std::async(std::launch::async, [&] {
    engine.stats();
    engine.explain(ns, prompt);
    engine.namespace_stats(ns);
    engine.pin(ns, prompt, 1000);
    engine.flush_cache();
    return true;
  });
  const bool returned = ops.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  {
    std::lock_guard lock(mu);
    released = true;
  }
  cv.notify_all();
  EXPECT_TRUE(returned) << "a cache operation waited for the forward pass";
  ops.get();
  EXPECT_EQ(collect_within(h, 10).stats.generated_tokens, 2u);
}

// Defect: every distinct cache_salt left a namespace behind for good.
TEST(EnginePressure, NamespacesDoNotPileUp) {
  Loaded m(testing::synthetic_model_path("tiny", DType::F32));
  EngineOptions o;
  o.threads = 1;
  o.kv_memory_bytes = block_bytes(m) * 16;
  Engine engine(*m.model, *m.tokenizer, o);
  model::Rng rng(7);
  for (int i = 0; i < 200; ++i) {
    Request r = greedy(random_prompt(rng, 512, 20), 1);
    r.ns = engine.namespace_for("salt-" + std::to_string(i));
    collect(*engine.submit(r));
  }
  EXPECT_LE(engine.stats().cache.namespaces, 16u);
  engine.flush_cache();
  EXPECT_EQ(engine.stats().cache.namespaces, 0u);
}

// Defect: admission counted the cached blocks a request would itself share both as blocks it
// did not need and as free room, over-admitting and forcing a preemption on the next step.
TEST(EnginePressure, AdmissionDoesNotCountSharedBlocksTwice) {
  Loaded m(testing::synthetic_model_path("tiny", DType::F32));
  EngineOptions o;
  o.threads = 1;
  o.kv_memory_bytes = block_bytes(m) * 8;
  Engine engine(*m.model, *m.tokenizer, o);
  const kv::Hash256 ns = engine.namespace_for("");
  model::Rng rng(8);
  const auto prefix = random_prompt(rng, 512, 64);
  Request first = greedy(prefix, 1);
  first.ns = ns;
  collect(*engine.submit(first));  // 4 blocks cached, unreferenced
  Request longer = greedy(random_prompt(rng, 512, 20), 40);
  longer.ns = ns;
  auto running = engine.submit(longer);  // grows to 4 blocks
  TokenEvent e;
  ASSERT_TRUE(running->next(e));
  auto extended = prefix;
  const auto tail = random_prompt(rng, 512, 31);
  extended.insert(extended.end(), tail.begin() + 1, tail.end());
  Request second = greedy(extended, 1);
  second.ns = ns;
  auto h = engine.submit(second);
  EXPECT_EQ(collect_within(running, 20).error, "");
  EXPECT_EQ(collect_within(h, 20).error, "");
  EXPECT_EQ(engine.stats().preemptions, 0u);
}

}  // namespace
}  // namespace kvc::engine
