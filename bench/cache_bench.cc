#include "bench/cache_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "base/byte_size.h"
#include "base/thread_pool.h"
#include "engine/completion.h"
#include "kv/cache_namespace.h"
#include "kv/prefix_index.h"
#include "model/llama_model.h"
#include "model/model_fingerprint.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

namespace kvc::bench {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A one-layer, one-head, one-dimension geometry: the index's cost does not depend on the KV
// payload, so the bench keeps the arena small while holding a million tokens.
kv::KvGeometry index_geometry(int block_tokens) {
  return kv::KvGeometry{1, 1, 1, block_tokens, DType::F32};
}
}  // namespace

void run_prefix_index_bench(const PrefixIndexBenchOptions& o, std::ostream& out) {
  const kv::KvGeometry g = index_geometry(o.block_tokens);
  const size_t sequence_tokens = 1024;
  const size_t blocks =
      g.blocks_for_tokens(o.cached_tokens) + 4 * (sequence_tokens / o.block_tokens) + 64;
  kv::BlockPool pool(g, blocks * g.bytes_per_block());
  kv::PrefixIndex index(pool);
  const kv::Hash256 ns = kv::namespace_hash({});
  model::Rng rng(7);
  // Sequences share one of 64 system prompts of 256 tokens, then go their own way, so the
  // tree has both deep shared paths and many branches.
  std::vector<std::vector<int32_t>> systems(64);
  for (auto& s : systems) {
    for (int i = 0; i < 256; ++i) s.push_back(static_cast<int32_t>(rng.next() % 32000));
  }
  const auto make_sequence = [&] {
    std::vector<int32_t> s = systems[rng.next() % systems.size()];
    while (s.size() < sequence_tokens) s.push_back(static_cast<int32_t>(rng.next() % 32000));
    return s;
  };
  const auto add = [&](const std::vector<int32_t>& s) {
    kv::BlockTable t(pool);
    const kv::PrefixMatch m = index.match(ns, s, s.size(), t);
    if (!t.reserve(s.size())) return m;
    index.insert(ns, s, s.size(), t, true);
    return m;
  };
  const auto fill_start = Clock::now();
  while (index.stats().nodes * o.block_tokens < o.cached_tokens) add(make_sequence());
  const double fill_s = seconds_since(fill_start);
  const size_t nodes = index.stats().nodes;
  const size_t index_bytes = index.index_bytes();

  std::vector<std::vector<int32_t>> queries;
  for (size_t i = 0; i < std::min<size_t>(o.operations, 2000); ++i)
    queries.push_back(make_sequence());
  size_t matched = 0;
  const auto start = Clock::now();
  for (size_t i = 0; i < o.operations; ++i)
    matched += add(queries[i % queries.size()]).cached_tokens;
  const double s = seconds_since(start);
  out << fmt::format(
      "prefix index: {} cached tokens in {} blocks of {} tokens (filled in {:.2f} s)\n"
      "  match + insert of {}-token sequences: {:.0f} operations/s ({:.1f} M tokens/s looked up), "
      "{:.1f}% of tokens hit\n"
      "  index bookkeeping: {} for {} blocks = {:.0f} bytes per cached block ({:.2f} bytes per "
      "token)\n",
      nodes * o.block_tokens, nodes, o.block_tokens, fill_s, sequence_tokens, o.operations / s,
      o.operations * sequence_tokens / s / 1e6, 100.0 * matched / (o.operations * sequence_tokens),
      format_bytes(index_bytes), nodes, static_cast<double>(index_bytes) / nodes,
      static_cast<double>(index_bytes) / (nodes * o.block_tokens));
}

void run_kv_waste_bench(const KvWasteBenchOptions& o, std::ostream& out) {
  model::Rng rng(11);
  std::vector<size_t> lengths(o.sequences);
  size_t total_tokens = 0;
  for (size_t& n : lengths) {
    // Log-uniform lengths: chat traffic has many short requests and a long tail.
    const double lo = std::log(static_cast<double>(o.min_tokens));
    const double hi = std::log(static_cast<double>(o.max_tokens));
    n = static_cast<size_t>(std::exp(lo + (hi - lo) * rng.uniform()));
    total_tokens += n;
  }
  out << fmt::format(
      "KV waste: {} sequences of {}..{} tokens (log-uniform, mean {:.0f}), all resident\n",
      o.sequences, o.min_tokens, o.max_tokens, static_cast<double>(total_tokens) / o.sequences);
  out << fmt::format("  {:>12} {:>14} {:>14} {:>8}\n", "block tokens", "allocated", "unused",
                     "waste");
  for (int block : {1, 8, 16, 32, 64, 128}) {
    // Stories260K's geometry; waste as a fraction does not depend on it.
    const kv::KvGeometry g{5, 4, 8, block, DType::F32};
    const size_t blocks_needed = [&] {
      size_t b = 0;
      for (size_t n : lengths) b += g.blocks_for_tokens(n);
      return b;
    }();
    kv::BlockPool pool(g, blocks_needed * g.bytes_per_block());
    std::vector<kv::BlockTable> tables;
    tables.reserve(lengths.size());
    for (size_t n : lengths) {
      tables.emplace_back(pool);
      if (!tables.back().reserve(n)) return;
    }
    const size_t allocated = pool.counts().referenced * g.bytes_per_block();
    const size_t used = total_tokens * g.bytes_per_token();
    out << fmt::format("  {:>12} {:>14} {:>14} {:>7.2f}%\n", block, allocated, allocated - used,
                       100.0 * (allocated - used) / allocated);
  }
}

void run_shared_prefix_bench(const SharedPrefixBenchOptions& o, std::ostream& out) {
  const auto model = model::LlamaModel::load(o.model_path);
  const auto& c = model->config();
  model::Rng rng(5);
  const auto word = [&] { return static_cast<int32_t>(3 + rng.next() % (c.n_vocab - 3)); };
  std::vector<int32_t> preamble = {1};
  while (static_cast<int>(preamble.size()) < o.preamble_tokens) preamble.push_back(word());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < o.prompts; ++i) {
    std::vector<int32_t> p = preamble;
    for (int j = 0; j < o.question_tokens; ++j) p.push_back(word());
    prompts.push_back(std::move(p));
  }
  const kv::KvGeometry g = c.kv_geometry(DType::F16, DType::F16, kv::kDefaultBlockTokens);
  const auto tokenizer = model::Tokenizer::from_gguf(model->file());
  struct Result {
    double prefill_ms = 0, ttft_ms_sum = 0;
    size_t cached = 0;
  };
  const auto run = [&](bool cache_on) {
    engine::EngineOptions eo;
    eo.kv_memory_bytes =
        g.blocks_for_tokens(o.preamble_tokens + o.question_tokens + 8) * 64 * g.bytes_per_block();
    eo.kv_k_dtype = g.k_dtype;
    eo.kv_v_dtype = g.v_dtype;
    eo.threads = o.threads;
    eo.max_running = 1;
    eo.prefix_cache = cache_on;
    engine::Engine engine(*model, tokenizer, eo);
    engine::Request req;
    req.max_tokens = 1;
    req.sampling.temperature = 0.0f;
    req.ns = engine.namespace_for("");
    Result r;
    for (const auto& p : prompts) {
      req.prompt = p;
      const engine::RequestStats s = engine::complete(engine, req).stats;
      r.prefill_ms += s.prefill_ms;
      r.ttft_ms_sum += s.ttft_ms;
      r.cached += s.cached_tokens;
    }
    return r;
  };
  run(false);  // warm-up: page in the weights
  const Result off = run(false);
  const Result on = run(true);
  const size_t total = prompts.size() * prompts.front().size();
  out << fmt::format(
      "shared prefix: {} prompts = {}-token preamble + {}-token question, {} ({} threads)\n"
      "  {:<10} {:>14} {:>16} {:>14}\n"
      "  {:<10} {:>14.1f} {:>16.2f} {:>14}\n"
      "  {:<10} {:>14.1f} {:>16.2f} {:>14}\n"
      "  prefill time ratio off/on: {:.1f}x, mean TTFT ratio off/on: {:.1f}x\n",
      o.prompts, o.preamble_tokens, o.question_tokens, o.model_path, o.threads, "cache",
      "prefill ms", "mean TTFT ms", "cached tokens", "off", off.prefill_ms,
      off.ttft_ms_sum / o.prompts, fmt::format("0 / {}", total), "on", on.prefill_ms,
      on.ttft_ms_sum / o.prompts, fmt::format("{} / {}", on.cached, total),
      off.prefill_ms / on.prefill_ms, off.ttft_ms_sum / on.ttft_ms_sum);
}

}  // namespace kvc::bench
