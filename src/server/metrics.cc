#include "server/metrics.h"

#include <fmt/format.h>

#include <cmath>

#include "base/dtype.h"

namespace kvc::server {

namespace {

std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string format_value(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  // Whole numbers (counters, counts) print without an exponent or fraction.
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);
}

void http_responses_family(PrometheusText& p, const std::map<int, uint64_t>& http_responses) {
  p.family("kvcache_http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [code, n] : http_responses) {
    p.sample("kvcache_http_responses_total", {{"code", std::to_string(code)}},
             static_cast<double>(n));
  }
}

}  // namespace

void PrometheusText::family(const std::string& name, const std::string& type,
                            const std::string& help) {
  out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void PrometheusText::sample(const std::string& name, const Labels& labels, double value) {
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i > 0) out_ += ',';
      out_ += fmt::format("{}=\"{}\"", labels[i].first, escape_label(labels[i].second));
    }
    out_ += '}';
  }
  out_ += ' ';
  out_ += format_value(value);
  out_ += '\n';
}

void PrometheusText::histogram(const std::string& name, const std::string& help,
                               const Histogram::Snapshot& s, double scale) {
  family(name, "histogram", help);
  for (size_t i = 0; i < s.bounds.size(); ++i) {
    sample(name + "_bucket", {{"le", format_value(s.bounds[i] * scale)}},
           static_cast<double>(s.cumulative[i]));
  }
  sample(name + "_bucket", {{"le", "+Inf"}}, static_cast<double>(s.cumulative.back()));
  sample(name + "_sum", {}, s.sum * scale);
  sample(name + "_count", {}, static_cast<double>(s.count));
}

std::string render_metrics(const engine::Engine& engine, const std::string& model_id,
                           const std::vector<TenantNamespaces>& tenants,
                           const std::map<int, uint64_t>& http_responses) {
  const engine::EngineStats st = engine.stats();
  const auto& options = engine.options();
  PrometheusText p;
  const auto d = [](auto v) { return static_cast<double>(v); };

  p.family("kvcache_info", "gauge", "The served model and KV layout (value is always 1).");
  p.sample("kvcache_info",
           {{"model", model_id},
            {"kv_dtype_k", std::string(dtype_name(options.kv_k_dtype))},
            {"kv_dtype_v", std::string(dtype_name(options.kv_v_dtype))},
            {"block_tokens", std::to_string(options.block_tokens)}},
           1);

  p.family("kvcache_kv_blocks", "gauge",
           "KV blocks by state: free, cached (unreferenced, kept for reuse, evictable), pinned "
           "(unreferenced, kept by a session or a pin until it ends or room is needed) and "
           "referenced (held by running requests).");
  p.sample("kvcache_kv_blocks", {{"state", "free"}}, d(st.blocks.free));
  p.sample("kvcache_kv_blocks", {{"state", "cached"}}, d(st.blocks.cached));
  p.sample("kvcache_kv_blocks", {{"state", "pinned"}}, d(st.blocks.pinned));
  p.sample("kvcache_kv_blocks", {{"state", "referenced"}}, d(st.blocks.referenced));
  p.family("kvcache_kv_blocks_capacity", "gauge", "KV blocks in the pool.");
  p.sample("kvcache_kv_blocks_capacity", {}, d(st.blocks.total));
  p.family("kvcache_kv_block_tokens", "gauge", "Tokens per KV block.");
  p.sample("kvcache_kv_block_tokens", {}, d(options.block_tokens));
  p.family("kvcache_kv_pool_bytes", "gauge", "Bytes of the KV pool's arena.");
  p.sample("kvcache_kv_pool_bytes", {}, d(engine.arena_bytes()));
  p.family("kvcache_kv_usage_ratio", "gauge",
           "Fraction of KV blocks referenced by running requests or sessions (cached blocks "
           "are reclaimable and not counted).");
  p.sample("kvcache_kv_usage_ratio", {},
           st.blocks.total ? d(st.blocks.referenced) / d(st.blocks.total) : 0.0);

  p.family("kvcache_prefix_cache_queried_tokens_total", "counter",
           "Prompt tokens looked up in the prefix cache (each admission of a request).");
  p.sample("kvcache_prefix_cache_queried_tokens_total", {}, d(st.cache.queried_tokens));
  p.family("kvcache_prefix_cache_hit_tokens_total", "counter",
           "Prompt tokens served from the prefix cache.");
  p.sample("kvcache_prefix_cache_hit_tokens_total", {}, d(st.cache.hit_tokens));

  std::vector<std::pair<std::string, kv::NamespaceStats>> per_tenant;
  for (const auto& t : tenants) {
    kv::NamespaceStats sum;
    for (const auto& ns : t.namespaces) {
      const kv::NamespaceStats n = engine.namespace_stats(ns);
      sum.blocks += n.blocks;
      sum.queried_tokens += n.queried_tokens;
      sum.hit_tokens += n.hit_tokens;
    }
    per_tenant.emplace_back(t.tenant, sum);
  }
  p.family("kvcache_tenant_prefix_cache_queried_tokens_total", "counter",
           "Prompt tokens looked up in the prefix cache, per tenant (all of its namespaces).");
  for (const auto& [t, s] : per_tenant) {
    p.sample("kvcache_tenant_prefix_cache_queried_tokens_total", {{"tenant", t}},
             d(s.queried_tokens));
  }
  p.family("kvcache_tenant_prefix_cache_hit_tokens_total", "counter",
           "Prompt tokens served from the prefix cache, per tenant.");
  for (const auto& [t, s] : per_tenant) {
    p.sample("kvcache_tenant_prefix_cache_hit_tokens_total", {{"tenant", t}}, d(s.hit_tokens));
  }
  p.family("kvcache_tenant_cached_blocks", "gauge",
           "KV blocks the prefix cache holds for each tenant.");
  for (const auto& [t, s] : per_tenant) {
    p.sample("kvcache_tenant_cached_blocks", {{"tenant", t}}, d(s.blocks));
  }

  p.family("kvcache_prefix_cache_inserted_blocks_total", "counter",
           "Blocks sealed into the prefix cache.");
  p.sample("kvcache_prefix_cache_inserted_blocks_total", {}, d(st.cache.inserted_blocks));
  p.family("kvcache_prefix_cache_evicted_blocks_total", "counter",
           "Cached blocks evicted to make room.");
  p.sample("kvcache_prefix_cache_evicted_blocks_total", {}, d(st.cache.evicted_blocks));
  p.family("kvcache_preemptions_total", "counter",
           "Running requests preempted for lack of KV blocks (they resume from their cached "
           "blocks).");
  p.sample("kvcache_preemptions_total", {}, d(st.preemptions));

  const engine::TierCounts& t = st.tiers;
  if (t.disk || t.redis) {
    p.family("kvcache_tier_hits_total", "counter", "Blocks read from a lower KV tier.");
    if (t.disk) p.sample("kvcache_tier_hits_total", {{"tier", "disk"}}, d(t.disk_store.hits));
    if (t.redis) p.sample("kvcache_tier_hits_total", {{"tier", "redis"}}, d(t.redis_store.hits));
    p.family("kvcache_tier_stored_blocks_total", "counter", "Blocks written to a lower KV tier.");
    if (t.disk) {
      p.sample("kvcache_tier_stored_blocks_total", {{"tier", "disk"}}, d(t.disk_store.writes));
    }
    if (t.redis) {
      p.sample("kvcache_tier_stored_blocks_total", {{"tier", "redis"}}, d(t.redis_store.writes));
    }
    p.family("kvcache_tier_bytes_total", "counter", "Bytes moved to and from a lower KV tier.");
    if (t.disk) {
      p.sample("kvcache_tier_bytes_total", {{"tier", "disk"}, {"direction", "out"}},
               d(t.disk_store.bytes_written));
      p.sample("kvcache_tier_bytes_total", {{"tier", "disk"}, {"direction", "in"}},
               d(t.disk_store.bytes_read));
    }
    if (t.redis) {
      p.sample("kvcache_tier_bytes_total", {{"tier", "redis"}, {"direction", "out"}},
               d(t.redis_store.bytes_written));
      p.sample("kvcache_tier_bytes_total", {{"tier", "redis"}, {"direction", "in"}},
               d(t.redis_store.bytes_read));
    }
    p.family("kvcache_tier_errors_total", "counter",
             "Lower-tier failures, by kind: corrupt blocks refused, failed writes or commands, "
             "writes dropped because the tier fell behind; each was recomputed instead.");
    if (t.disk) {
      p.sample("kvcache_tier_errors_total", {{"tier", "disk"}, {"kind", "corrupt"}},
               d(t.disk_store.corrupt));
      p.sample("kvcache_tier_errors_total", {{"tier", "disk"}, {"kind", "io"}},
               d(t.disk_store.write_errors + t.disk_store.read_errors));
      p.sample("kvcache_tier_errors_total", {{"tier", "disk"}, {"kind", "dropped"}},
               d(t.disk_writes.dropped));
    }
    if (t.redis) {
      p.sample("kvcache_tier_errors_total", {{"tier", "redis"}, {"kind", "corrupt"}},
               d(t.redis_store.corrupt));
      p.sample("kvcache_tier_errors_total", {{"tier", "redis"}, {"kind", "io"}},
               d(t.redis_store.errors));
      p.sample("kvcache_tier_errors_total", {{"tier", "redis"}, {"kind", "dropped"}},
               d(t.redis_writes.dropped + t.redis_store.skipped));
    }
    if (t.disk) {
      p.family("kvcache_tier_disk_bytes", "gauge", "Bytes of the disk tier's occupied block slots.");
      p.sample("kvcache_tier_disk_bytes", {}, d(t.disk_store.bytes));
    }
    p.family("kvcache_tier_decisions_total", "counter",
             "The cost model's decisions per tier: blocks stored, dropped because recomputing "
             "is faster than loading, dropped because blocks are seldom wanted again after "
             "eviction, stored when evicted after a reuse in the pool, hits loaded, hits "
             "recomputed because that was faster.");
    for (size_t i = 0; i < engine::kTierCount; ++i) {
      const auto tier = static_cast<engine::Tier>(i);
      if (tier == engine::Tier::kDisk ? !t.disk : !t.redis) continue;
      for (size_t k = 0; k < engine::kTierDecisionCount; ++k) {
        const auto decision = static_cast<engine::TierDecision>(k);
        p.sample("kvcache_tier_decisions_total",
                 {{"tier", std::string(engine::tier_name(tier))},
                  {"decision", std::string(engine::tier_decision_name(decision))}},
                 d(t.decisions[i][k]));
      }
    }
    p.family("kvcache_tier_cost_ms", "gauge",
             "The cost model's current figures: milliseconds to load a block from each tier, "
             "processor milliseconds to write one, and to recompute a block at a depth (tokens "
             "before it).");
    for (size_t i = 0; i < engine::kTierCount; ++i) {
      const auto tier = static_cast<engine::Tier>(i);
      if (tier == engine::Tier::kDisk ? !t.disk : !t.redis) continue;
      const std::string name(engine::tier_name(tier));
      p.sample("kvcache_tier_cost_ms", {{"op", "load"}, {"tier", name}}, t.cost.load_ms[i]);
      p.sample("kvcache_tier_cost_ms", {{"op", "write"}, {"tier", name}}, t.cost.write_ms[i]);
    }
    for (const double depth : {0.0, 1024.0, 4096.0}) {
      p.sample("kvcache_tier_cost_ms", {{"op", "recompute"}, {"depth", fmt::format("{}", depth)}},
               t.cost.block_recompute_ms(t.block_tokens, depth));
    }
    p.family("kvcache_tier_reads_per_block", "gauge",
             "The cost model's estimate of how often a block is wanted again after it leaves "
             "the pool (recent blocks weigh most).");
    p.sample("kvcache_tier_reads_per_block", {}, t.cost.tier_reads_per_block);
    if (t.disk) {
      p.histogram("kvcache_tier_disk_load_seconds", "Time to load one block from the disk tier.",
                  t.load_ms[0], 1e-3);
    }
    if (t.redis) {
      p.histogram("kvcache_tier_redis_load_seconds", "Time to load one block from the Redis tier.",
                  t.load_ms[1], 1e-3);
    }
  }

  p.family("kvcache_requests_running", "gauge", "Requests admitted and generating.");
  p.sample("kvcache_requests_running", {}, d(st.running));
  p.family("kvcache_requests_waiting", "gauge", "Requests queued for admission.");
  p.sample("kvcache_requests_waiting", {}, d(st.waiting));
  p.family("kvcache_sessions", "gauge", "Open sessions keeping a conversation's blocks.");
  p.sample("kvcache_sessions", {}, d(st.sessions));
  p.family("kvcache_requests_finished_total", "counter",
           "Requests that ended (completed, stopped, cancelled or failed).");
  p.sample("kvcache_requests_finished_total", {}, d(st.finished));
  p.family("kvcache_requests_cancelled_total", "counter",
           "Requests cancelled (client gone, or shutdown).");
  p.sample("kvcache_requests_cancelled_total", {}, d(st.cancelled));
  p.family("kvcache_requests_rejected_total", "counter", "Requests refused at submission.");
  p.sample("kvcache_requests_rejected_total", {{"reason", "overloaded"}},
           d(st.rejected_overloaded));
  p.sample("kvcache_requests_rejected_total", {{"reason", "too_large"}}, d(st.rejected_too_large));
  p.family("kvcache_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.");
  p.sample("kvcache_prompt_tokens_total", {}, d(st.prompt_tokens));
  p.family("kvcache_generation_tokens_total", "counter", "Tokens generated.");
  p.sample("kvcache_generation_tokens_total", {}, d(st.generated_tokens));

  http_responses_family(p, http_responses);

  p.histogram("kvcache_time_to_first_token_seconds", "Time from submission to the first token.",
              engine.ttft_histogram().snapshot(), 1e-3);
  p.histogram("kvcache_inter_token_latency_seconds", "Time between consecutive tokens.",
              engine.itl_histogram().snapshot(), 1e-3);
  p.histogram("kvcache_e2e_request_latency_seconds", "Time from submission to the end.",
              engine.e2e_histogram().snapshot(), 1e-3);
  p.histogram("kvcache_request_queue_time_seconds", "Time from submission to admission.",
              engine.queue_histogram().snapshot(), 1e-3);
  return p.text();
}

std::string render_tokenizer_only_metrics(const std::string& model_id,
                                          const std::map<int, uint64_t>& http_responses) {
  PrometheusText p;
  p.family("kvcache_info", "gauge", "The served model and KV layout (value is always 1).");
  p.sample("kvcache_info", {{"model", model_id}, {"mode", "tokenizer-only"}}, 1);
  http_responses_family(p, http_responses);
  return p.text();
}

}  // namespace kvc::server
