#include "bench/tier_bench.h"

#include <unistd.h>

#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/histogram.h"
#include "bench/bench_requests.h"
#include "engine/engine.h"
#include "kv/disk_store.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"

namespace kvc::bench {
namespace {

namespace fs = std::filesystem;
constexpr int kInFlight = 4;  // requests submitted together (and running together)

struct Workload {
  std::string name;
  std::vector<Tokens> requests;   // in arrival order
  size_t working_set_tokens = 0;  // distinct tokens of all of them
  size_t longest = 0;
};

enum class Policy { kDrop, kKeepAll, kCost };
constexpr Policy kPolicies[] = {Policy::kDrop, Policy::kKeepAll, Policy::kCost};
const char* policy_name(Policy p) {
  return p == Policy::kDrop ? "drop" : p == Policy::kKeepAll ? "keep-all" : "cost";
}

struct Result {
  double ttft_p50 = 0, ttft_p99 = 0, seconds = 0;
  double p99_low = 0, p99_high = 0;  // the range of p99 over the repetitions
  uint64_t prompt_tokens = 0, cached_tokens = 0, disk_tokens = 0;
  engine::TierCounts tiers;
};

// A directory made by this process (mkdtemp), holding only the disk tier's files; the bench
// deletes those (kv::DiskStore::remove_files), then the empty directory.
class TierDir {
 public:
  TierDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        (tmp && *tmp ? std::string(tmp) : std::string("/tmp")) + "/kvcache-bench-tiers-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) fail("bench tiers: cannot make {}", pattern);
    path_ = pattern;
  }
  ~TierDir() {
    kv::DiskStore::remove_files(path_);
    std::error_code ec;
    fs::remove(path_, ec);  // empty by then; a non-empty directory is left, never walked
  }
  TierDir(const TierDir&) = delete;
  TierDir& operator=(const TierDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

Workload make_workload(const std::string& name, const model::LlamaConfig& c, double scale,
                       uint64_t seed) {
  model::Rng rng(seed);
  const int vocab = c.n_vocab;
  const auto scaled = [&](int n) { return std::max(1, static_cast<int>(std::lround(n * scale))); };
  Workload w;
  w.name = name;
  if (name == "conversations") {
    // Each user returns to a conversation that grows by a turn each time; users take turns,
    // so a user's history has long left the pool when they come back.
    const int users = scaled(32), turns = 8;
    const int history = std::min(1500, c.context_length - 64);
    std::vector<Tokens> conversation;
    for (int u = 0; u < users; ++u) conversation.push_back(random_tokens(rng, vocab, history));
    for (int t = 0; t < turns; ++t) {
      for (int u = 0; u < users; ++u) {
        const size_t n = static_cast<size_t>(history) * (t + 1) / turns;
        w.requests.emplace_back(conversation[u].begin(), conversation[u].begin() + n);
      }
    }
    w.working_set_tokens = static_cast<size_t>(users) * history;
  } else if (name == "documents") {
    const int docs = 4, questions = scaled(64);
    const int length = std::min(8000, c.context_length - 64);
    std::vector<Tokens> doc;
    for (int d = 0; d < docs; ++d) doc.push_back(random_tokens(rng, vocab, length));
    for (int q = 0; q < questions; ++q) {
      Tokens p = doc[q % docs];
      const Tokens question = random_tokens(rng, vocab, 16);
      p.insert(p.end(), question.begin(), question.end());
      w.requests.push_back(std::move(p));
    }
    w.working_set_tokens = static_cast<size_t>(docs) * length + 16 * questions;
  } else if (name == "short") {
    const int prompts = scaled(2000);
    for (int i = 0; i < prompts; ++i) w.requests.push_back(random_tokens(rng, vocab, 60));
    w.working_set_tokens = static_cast<size_t>(prompts) * 60;
  } else {
    fail("bench tiers: unknown workload '{}': use conversations, documents or short", name);
  }
  for (const auto& r : w.requests) w.longest = std::max(w.longest, r.size());
  return w;
}

engine::EngineOptions options_for(const model::LlamaModel& model, const Workload& w, Policy p,
                                  const fs::path& dir, int threads) {
  engine::EngineOptions e;
  e.threads = threads;
  e.max_running = kInFlight;
  const auto g = model.config().kv_geometry(e.kv_k_dtype, e.kv_v_dtype, e.block_tokens);
  // A quarter of the working set, but room for the requests running together.
  const size_t blocks = std::max(g.blocks_for_tokens(w.working_set_tokens) / 4,
                                 (g.blocks_for_tokens(w.longest + 1) + 1) * kInFlight);
  e.kv_memory_bytes = blocks * g.bytes_per_block();
  if (p != Policy::kDrop) {
    e.kv_tiers.disk_dir = dir.string();
    e.kv_tiers.disk_max_bytes = uint64_t{64} << 30;
    e.kv_tiers.policy =
        p == Policy::kKeepAll ? engine::TierPolicy::kKeepAll : engine::TierPolicy::kCostModel;
  }
  return e;
}

// Submits requests[first, first + kInFlight) together and waits for them, adding their TTFT
// and counts to r.
void run_wave(engine::Engine& e, const std::vector<Tokens>& requests, size_t first,
              const kv::Hash256& ns, Result& r, std::vector<double>& ttft) {
  // Submitted together, so that no wave is split by which request the step thread saw first.
  std::vector<engine::Request> wave;
  for (size_t j = first; j < std::min(requests.size(), first + kInFlight); ++j) {
    wave.push_back(make_request(requests[j], 1, ns));
  }
  for (auto& h : e.submit_all(std::move(wave))) {
    h->wait_text();
    const engine::RequestStats s = h->stats();
    ttft.push_back(s.ttft_ms);
    r.prompt_tokens += s.prompt_tokens;
    r.cached_tokens += s.cached_tokens;
    r.disk_tokens += s.disk_tokens;
  }
}

void set_quantiles(Result& r, std::vector<double>& ttft) {
  r.ttft_p50 = quantile(ttft, 0.5);
  r.ttft_p99 = quantile(ttft, 0.99);
}

// Sends requests kInFlight at a time, each waiting for its wave.
Result replay(engine::Engine& e, const std::vector<Tokens>& requests, const kv::Hash256& ns) {
  Result r;
  std::vector<double> ttft;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < requests.size(); i += kInFlight) run_wave(e, requests, i, ns, r, ttft);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  set_quantiles(r, ttft);
  return r;
}

// The orders of the three policies, the six of a Williams design, in which each policy follows
// each other one equally often: a policy's work can slow the one after it.
constexpr size_t kOrders[6][3] = {{0, 1, 2}, {2, 1, 0}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}};

// Replays the workload under every policy at once, one engine each: every wave of requests goes
// to the three engines in turn, in an order that rotates from wave to wave, so that a slow
// spell of a shared machine (one binary's prefill rate can vary twofold between runs here)
// falls on all of them alike. An engine's tier writes are drained after its wave, so that they
// fall on no other policy's wave; a wave's blocks are a few, and their writes well under a
// millisecond.
std::map<Policy, Result> replay_policies(const model::LlamaModel& model,
                                         const model::Tokenizer& tok, const Workload& w,
                                         int threads, size_t rotation) {
  struct Run {
    std::unique_ptr<TierDir> dir;
    std::unique_ptr<engine::Engine> engine;
    kv::Hash256 ns{};
    Result result;
    std::vector<double> ttft;
  };
  std::map<Policy, Run> runs;
  for (const Policy p : kPolicies) {
    Run& run = runs[p];
    run.dir = std::make_unique<TierDir>();
    run.engine = std::make_unique<engine::Engine>(
        model, tok, options_for(model, w, p, run.dir->path(), threads));
    run.ns = run.engine->namespace_for("bench");
  }
  for (size_t i = 0, wave = 0; i < w.requests.size(); i += kInFlight, ++wave) {
    for (const size_t k : kOrders[(rotation + wave) % 6]) {
      Run& run = runs[kPolicies[k]];
      const auto start = std::chrono::steady_clock::now();
      run_wave(*run.engine, w.requests, i, run.ns, run.result, run.ttft);
      run.result.seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      run.engine->drain_tiers();
    }
  }
  std::map<Policy, Result> results;
  for (auto& [p, run] : runs) {
    set_quantiles(run.result, run.ttft);
    run.result.tiers = run.engine->stats().tiers;
    run.engine->flush_tiers();
    results[p] = run.result;
  }
  return results;
}

struct WarmRestart {
  uint64_t before = 0, after = 0, prompt = 0, dropped = 0;
};

// The last 20 conversation turns are sent with the pool emptied (so their hits come from the
// disk), then again to a new engine on the same directory: a restart must find those blocks.
WarmRestart warm_restart(const model::LlamaModel& model, const model::Tokenizer& tok,
                         const Workload& w, int threads) {
  TierDir dir;
  const std::vector<Tokens> probe(w.requests.end() - std::min<size_t>(20, w.requests.size()),
                                  w.requests.end());
  WarmRestart out;
  kv::Hash256 ns{};
  {
    engine::Engine a(model, tok, options_for(model, w, Policy::kKeepAll, dir.path(), threads));
    ns = a.namespace_for("bench");
    replay(a, w.requests, ns);
    a.drain_tiers();
    a.flush_cache();
    const Result before = replay(a, probe, ns);
    out.before = before.cached_tokens;
    out.prompt = before.prompt_tokens;
    a.drain_tiers();
    out.dropped = a.stats().tiers.disk_writes.dropped;
  }
  {
    engine::Engine b(model, tok, options_for(model, w, Policy::kKeepAll, dir.path(), threads));
    out.after = replay(b, probe, ns).cached_tokens;
    b.flush_tiers();
  }
  return out;
}

// The runs of one policy as one row: the counts (hits, blocks stored and dropped) of the run
// whose TTFT p99 is the median (the lower middle one for an even count), the medians of TTFT
// p50, p99 and seconds, and the range of p99.
Result median_run(std::vector<Result> runs) {
  const auto median = [&](double Result::*field) {
    std::vector<double> v;
    for (const Result& r : runs) v.push_back(r.*field);
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  const double p50 = median(&Result::ttft_p50), p99 = median(&Result::ttft_p99),
               seconds = median(&Result::seconds);
  std::sort(runs.begin(), runs.end(),
            [](const Result& a, const Result& b) { return a.ttft_p99 < b.ttft_p99; });
  Result m = runs[(runs.size() - 1) / 2];
  m.ttft_p50 = p50;
  m.ttft_p99 = p99;
  m.seconds = seconds;
  m.p99_low = runs.front().ttft_p99;
  m.p99_high = runs.back().ttft_p99;
  return m;
}

}  // namespace

void run_tier_bench(const TierBenchOptions& o, std::ostream& out) {
  const auto model = model::LlamaModel::load(o.model_path);
  const auto tokenizer = model::Tokenizer::from_gguf(model->file());
  nlohmann::json json_rows = nlohmann::json::array();
  if (!o.json) {
    out << fmt::format(
        "bench tiers: {} ({} layers, context {}), f16 KV, {} threads, {} requests "
        "in flight, pool = a quarter of each working set{}\n\n",
        o.model_path, model->config().n_layers, model->config().context_length, o.threads,
        kInFlight,
        o.repeat > 1 ? fmt::format("; TTFT medians of {} runs per policy", o.repeat)
                     : std::string());
    out << fmt::format("{:<14} {:<9} {:>9} {:>12} {:>12} {:>9} {:>9} {:>8} {:>8}", "workload",
                       "policy", "requests", "TTFT p50 ms", "TTFT p99 ms", "hit %", "disk %",
                       "stored", "dropped");
    if (o.repeat > 1) out << fmt::format(" {:>14}", "p99 range");
    out << "\n";
  }
  for (const std::string& name : o.workloads) {
    const Workload w = make_workload(name, model->config(), o.scale, o.seed);
    // Each repetition starts the rotation of the policies' order elsewhere; each policy's
    // figures are the medians over the repetitions.
    std::map<Policy, std::vector<Result>> runs;
    for (int rep = 0; rep < o.repeat; ++rep) {
      // The previous workload's writes are on the disk before this one starts.
      ::sync();
      for (auto& [p, r] :
           replay_policies(*model, tokenizer, w, o.threads, static_cast<size_t>(rep))) {
        runs[p].push_back(r);
      }
    }
    std::map<Policy, Result> results;
    for (const Policy p : kPolicies) {
      const Result r = median_run(runs[p]);
      results[p] = r;
      const auto& d = r.tiers.decisions[static_cast<size_t>(engine::Tier::kDisk)];
      // Blocks written (when computed, or when evicted after a reuse) and never written.
      const uint64_t late = d[static_cast<size_t>(engine::TierDecision::kStoredWhenEvicted)];
      const uint64_t stored = d[static_cast<size_t>(engine::TierDecision::kStored)] + late;
      const uint64_t dropped = d[static_cast<size_t>(engine::TierDecision::kDroppedCheap)] +
                               d[static_cast<size_t>(engine::TierDecision::kDroppedSeldomReused)] -
                               late;
      const double hit = 100.0 * r.cached_tokens / std::max<uint64_t>(1, r.prompt_tokens);
      const double disk = 100.0 * r.disk_tokens / std::max<uint64_t>(1, r.prompt_tokens);
      if (o.json) {
        json_rows.push_back(
            {{"workload", name},
             {"policy", policy_name(p)},
             {"requests", w.requests.size()},
             {"ttft_p50_ms", r.ttft_p50},
             {"ttft_p99_ms", r.ttft_p99},
             {"hit_fraction", hit / 100},
             {"disk_fraction", disk / 100},
             {"stored_blocks", stored},
             {"dropped_blocks", dropped},
             {"writes_lost", r.tiers.disk_writes.dropped},
             {"reads_per_block", r.tiers.cost.tier_reads_per_block},
             {"write_ms", r.tiers.cost.write_ms[0]},
             {"load_ms", r.tiers.cost.load_ms[0]},
             {"recompute_ms_depth0", r.tiers.cost.block_recompute_ms(r.tiers.block_tokens, 0)},
             {"recomputed_faster_blocks",
              d[static_cast<size_t>(engine::TierDecision::kRecomputedFaster)]},
             {"seconds", r.seconds},
             {"repetitions", o.repeat},
             {"ttft_p99_range_ms", {r.p99_low, r.p99_high}}});
      } else {
        out << fmt::format("{:<14} {:<9} {:>9} {:>12.2f} {:>12.2f} {:>9.1f} {:>9.1f} {:>8} {:>8}",
                           name, policy_name(p), w.requests.size(), r.ttft_p50, r.ttft_p99, hit,
                           disk, stored, dropped);
        if (o.repeat > 1)
          out << fmt::format(" {:>14}", fmt::format("{:.2f}-{:.2f}", r.p99_low, r.p99_high));
        out << "\n";
      }
    }
    const Result& cost = results[Policy::kCost];
    const double best_p50 =
        std::min(results[Policy::kDrop].ttft_p50, results[Policy::kKeepAll].ttft_p50);
    const double best_p99 =
        std::min(results[Policy::kDrop].ttft_p99, results[Policy::kKeepAll].ttft_p99);
    if (!o.json) {
      out << fmt::format(
          "{:<14} cost / best fixed policy: TTFT p50 {:.2f}x, p99 {:.2f}x; drop / cost p50: "
          "{:.2f}x\n",
          "", cost.ttft_p50 / best_p50, cost.ttft_p99 / best_p99,
          results[Policy::kDrop].ttft_p50 / cost.ttft_p50);
    }
  }
  const Workload conv = make_workload("conversations", model->config(), o.scale, o.seed);
  const WarmRestart wr = warm_restart(*model, tokenizer, conv, o.threads);
  if (o.json) {
    out << nlohmann::json{{"runs", json_rows},
                          {"warm_restart",
                           {{"hit_tokens_before", wr.before},
                            {"hit_tokens_after", wr.after},
                            {"prompt_tokens", wr.prompt},
                            {"writes_dropped", wr.dropped}}}}
               .dump(2)
        << "\n";
    return;
  }
  out << fmt::format(
      "\nwarm restart: the last 20 turns hit {} tokens from disk before a restart and {} after "
      "it ({:.1f}%), of {} prompt tokens; {} block writes were dropped behind\n",
      wr.before, wr.after, 100.0 * wr.after / std::max<uint64_t>(1, wr.before), wr.prompt,
      wr.dropped);
}

}  // namespace kvc::bench
