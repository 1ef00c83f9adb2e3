// A bounded soak test over loopback: three tenants with sessions, admin pins, n > 1, clients
// that hang up mid-stream and salts that come and go, on a pool kept at 100% use. Every request
// must end (200 or a clear error), preemptions stay rare, a short request sent in the middle
// answers quickly, and nothing is left referenced or leaked at the end.
//
// KVCACHE_SOAK_SECONDS sets the load phase (default 45 s; the sanitizer builds run 20 s).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include "server/server_fixture.h"

namespace kvc::server::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double soak_seconds() {
  const char* v = std::getenv("KVCACHE_SOAK_SECONDS");
  if (v == nullptr || *v == '\0') return 45;
  return std::clamp(std::atof(v), 2.0, 110.0);
}

const std::vector<std::pair<std::string, std::string>> kTenants = {
    {"sk-alice", "alice"}, {"sk-bob", "bob"}, {"sk-carol", "carol"}};

struct Tally {
  std::mutex mu;
  std::map<int, int> statuses;
  std::vector<std::string> unclear;  // answers that were neither 200 nor a clear error
  int requests = 0;

  void record(int status, const std::string& what, const json& body) {
    std::lock_guard lock(mu);
    ++requests;
    ++statuses[status];
    if (status == 200) return;
    const bool clear = status >= 400 && status < 500 && body.is_object() &&
                       body.contains("error") && body["error"].is_object() &&
                       body["error"].value("message", "").size() > 10;
    if (!clear) unclear.push_back(fmt::format("{} -> {}: {}", what, status, body.dump()));
  }
};

// Token ids for a prompt: a per-tenant shared prefix of 48 tokens, then a varied tail.
std::vector<int32_t> prompt_ids(std::mt19937& rng, int tenant, size_t tail) {
  std::vector<int32_t> p = ids(48, 100 + tenant);
  std::uniform_int_distribution<int32_t> tok(3, 500);
  for (size_t i = 0; i < tail; ++i) p.push_back(tok(rng));
  return p;
}

TEST(Soak, EveryRequestEndsAndNothingLeaks) {
  const std::string path = tiny_model();
  engine::EngineOptions eo = TestServer::default_engine();
  eo.block_tokens = 16;
  eo.max_running = 6;
  eo.max_waiting = 64;
  eo.session_ttl_ms = 1500;
  eo.session_max_blocks = 12;
  // Sized below what the load wants, so the pool runs full and must be shared.
  {
    auto probe = model::LlamaModel::load(path);
    eo.kv_memory_bytes =
        probe->config().kv_geometry(DType::F16, DType::F16, 16).bytes_per_block() * 96;
  }
  ServerOptions so;
  so.api_keys = ApiKeys::parse("sk-alice alice admin\nsk-bob bob\nsk-carol carol\n", "keys");
  TestServer s(path, eo, so);

  const double seconds = soak_seconds();
  const auto start = Clock::now();
  const auto stop_at =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  Tally tally;
  std::atomic<bool> pool_full{false};
  std::atomic<int> disconnects{0};

  auto client = [&](int worker) {
    std::mt19937 rng(1234 + worker);
    const int tenant = worker % 3;
    const std::string key = kTenants[tenant].first;
    int turn = 0;
    std::vector<int32_t> conversation = prompt_ids(rng, tenant, 8);
    while (Clock::now() < stop_at) {
      const int kind = static_cast<int>(rng() % 6);
      json body = {{"temperature", 0.8}, {"seed", static_cast<int>(rng() % 1000)}};
      std::string what;
      if (kind == 0) {
        // A session: each turn extends the conversation and reuses its pinned blocks.
        for (int i = 0; i < 12; ++i) conversation.push_back(static_cast<int32_t>(3 + rng() % 490));
        if (conversation.size() > 300) conversation = prompt_ids(rng, tenant, 8);
        body["prompt"] = conversation;
        body["max_tokens"] = 8;
        body["session_id"] = fmt::format("w{}-conv", worker);
        what = fmt::format("session turn {}", ++turn);
      } else if (kind == 1) {
        body["prompt"] = prompt_ids(rng, tenant, 10 + rng() % 60);
        body["max_tokens"] = 16;
        body["n"] = 3;
        what = "n=3";
      } else if (kind == 2) {
        // Hangs up after the first token.
        body["prompt"] = prompt_ids(rng, tenant, 20 + rng() % 80);
        body["max_tokens"] = 64;
        body["stream"] = true;
        const SseResult r =
            stream(s, "/v1/completions", body, key, [](const json&) { return false; });
        ++disconnects;
        std::lock_guard lock(tally.mu);
        ++tally.requests;
        if (r.status != 200 && r.status != -1) {
          tally.unclear.push_back(fmt::format("disconnecting stream -> {}", r.status));
        }
        continue;
      } else if (kind == 3) {
        // A salt per request family: namespaces come and go.
        body["prompt"] = prompt_ids(rng, tenant, 30 + rng() % 100);
        body["max_tokens"] = 12;
        body["cache_salt"] = fmt::format("salt-{}", rng() % 20);
        what = "salted";
      } else if (kind == 4 && tenant == 0) {
        // The admin pins another tenant's shared prefix for a short while.
        const int target = static_cast<int>(rng() % 3);
        json pin = {{"prompt", ids(48, 100 + target)},
                    {"ttl_seconds", 1.0},
                    {"tenant", kTenants[target].second}};
        const Reply r = post(s, "/v1/cache/pin", pin, key);
        tally.record(r.status, "pin", r.body);
        continue;
      } else {
        body["prompt"] = prompt_ids(rng, tenant, 100 + rng() % 200);
        body["max_tokens"] = 24;
        what = "long";
      }
      const Reply r = post(s, "/v1/completions", body, key);
      tally.record(r.status, what, r.body);
    }
    // Sessions end with the load; their pins go with them.
  };

  std::vector<std::thread> workers;
  for (int w = 0; w < 9; ++w) workers.emplace_back(client, w);

  // Watches the pool: it must run full at some point.
  std::thread watcher([&] {
    while (Clock::now() < stop_at) {
      const engine::EngineStats st = s.engine->stats();
      if (st.blocks.free == 0) pool_full = true;
      std::this_thread::sleep_for(20ms);
    }
  });

  // A short request in the middle of the load answers within 2 s, end to end.
  std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(seconds / 2)));
  const auto t0 = Clock::now();
  const Reply quick =
      post(s, "/v1/completions", json{{"prompt", ids(5, 7)}, {"max_tokens", 5}, {"temperature", 0}},
           kTenants[1].first);
  const double quick_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();

  for (auto& t : workers) t.join();
  watcher.join();

  EXPECT_EQ(quick.status, 200) << quick.text;
  EXPECT_LT(quick_ms, 2000) << "a 5-token request took " << quick_ms << " ms under load";

  {
    std::lock_guard lock(tally.mu);
    EXPECT_TRUE(tally.unclear.empty()) << ::testing::PrintToString(tally.unclear);
    EXPECT_GT(tally.statuses[200], 20);
    std::string summary;
    for (const auto& [status, count] : tally.statuses) {
      summary += fmt::format(" {}x{}", count, status);
    }
    std::cout << "[soak] " << seconds << " s, " << tally.requests << " requests:" << summary << ", "
              << disconnects << " disconnects, quick request " << quick_ms << " ms\n";
  }
  EXPECT_TRUE(pool_full.load()) << "the pool never ran full; the test is not under pressure";

  // Drained: nothing referenced; once sessions and pins expire and the cache is flushed, no
  // namespace is left behind.
  ASSERT_TRUE(eventually([&] { return s.engine->stats().blocks.referenced == 0; }, 10s));
  std::this_thread::sleep_for(1600ms);  // past every session and pin TTL
  const Reply flushed = post(s, "/v1/cache/flush", json::object(), kTenants[0].first);
  EXPECT_EQ(flushed.status, 200) << flushed.text;
  const engine::EngineStats end = s.engine->stats();
  std::cout << "[soak] preemptions " << end.preemptions << ", sessions " << end.sessions
            << ", namespaces " << end.cache.namespaces << "\n";
  EXPECT_LT(end.preemptions, 100u);
  EXPECT_EQ(end.blocks.referenced, 0u);
  EXPECT_EQ(end.blocks.pinned, 0u);
  EXPECT_EQ(end.cache.namespaces, 0u);
  EXPECT_EQ(end.blocks.free, end.blocks.total);
}

}  // namespace
}  // namespace kvc::server::testing
