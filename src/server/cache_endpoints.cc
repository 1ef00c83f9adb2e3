#include "server/cache_endpoints.h"

#include <fmt/format.h>

#include "server/api_error.h"
#include "server/choice_accumulator.h"
#include "server/generation.h"
#include "server/openai_protocol.h"
#include "server/request_mapping.h"

namespace kvc::server {

namespace {

double rate(uint64_t hit, uint64_t queried) {
  return queried ? static_cast<double>(hit) / static_cast<double>(queried) : 0.0;
}

}  // namespace

nlohmann::json CacheEndpoints::stats(const Tenant& tenant) const {
  const engine::Engine& engine = backend_.engine();
  const kv::KvGeometry& g = engine.geometry();
  const kv::NamespaceStats own = tenants_.stats(engine, tenant.name);
  // The layout is configuration, the same for everyone; counts of blocks in use are not.
  nlohmann::json j = {{"model", backend_.model_id},
                      {"prefix_cache_enabled", engine.options().prefix_cache},
                      {"block_tokens", g.block_tokens},
                      {"bytes_per_token", g.bytes_per_token()},
                      {"bytes_per_block", g.bytes_per_block()},
                      {"pool_bytes", engine.arena_bytes()},
                      {"tenant",
                       {{"name", tenant.name},
                        {"cached_blocks", own.blocks},
                        {"pinned_blocks", own.pinned_blocks},
                        {"pinned_blocks_limit", engine.tenant_pinned_max_blocks()},
                        {"queried_tokens", own.queried_tokens},
                        {"hit_tokens", own.hit_tokens},
                        {"hit_rate", rate(own.hit_tokens, own.queried_tokens)}}}};
  if (!tenant.admin) {
    j["blocks"] = {{"total", engine.num_blocks()}};
    return j;
  }
  const engine::EngineStats st = engine.stats();
  j["blocks"] = {{"total", st.blocks.total},
                 {"free", st.blocks.free},
                 {"cached", st.blocks.cached},
                 {"pinned", st.blocks.pinned},
                 {"referenced", st.blocks.referenced}};
  j["usage"] = st.blocks.total ? static_cast<double>(st.blocks.referenced) /
                                     static_cast<double>(st.blocks.total)
                               : 0.0;
  j["prefix_cache"] = {{"cached_blocks", st.cache.nodes},
                       {"namespaces", st.cache.namespaces},
                       {"inserted_blocks", st.cache.inserted_blocks},
                       {"evicted_blocks", st.cache.evicted_blocks},
                       {"queried_tokens", st.cache.queried_tokens},
                       {"hit_tokens", st.cache.hit_tokens},
                       {"hit_rate", rate(st.cache.hit_tokens, st.cache.queried_tokens)}};
  j["requests"] = {{"running", st.running},
                   {"waiting", st.waiting},
                   {"finished", st.finished},
                   {"cancelled", st.cancelled},
                   {"rejected_overloaded", st.rejected_overloaded},
                   {"rejected_too_large", st.rejected_too_large},
                   {"preemptions", st.preemptions}};
  j["sessions"] = st.sessions;
  return j;
}

nlohmann::json CacheEndpoints::explain(const Tenant& tenant, const nlohmann::json& body) {
  engine::Engine& engine = backend_.engine();
  const JsonFields f(body);
  const std::string salt = parse_cache_salt(f);
  const std::vector<int32_t> tokens = prompt_tokens(backend_, body, true, "/v1/cache/explain");
  if (tokens.empty()) bad_field("prompt", "the prompt has no tokens");
  const kv::PrefixMatch m =
      engine.explain(tenants_.namespace_of(engine, tenant.name, salt), tokens);
  return {{"prompt_tokens", tokens.size()},   {"cached_tokens", m.cached_tokens},
          {"would_hit", m.cached_tokens > 0}, {"shared_blocks", m.shared_blocks},
          {"copied_tokens", m.copied_tokens}, {"miss", miss_json(m.miss, kv::steady_clock_ms()())}};
}

nlohmann::json CacheEndpoints::pin(const Tenant& tenant, const nlohmann::json& body) {
  engine::Engine& engine = backend_.engine();
  const JsonFields f(body);
  const auto ttl = f.number("ttl_seconds", 0.0, 30.0 * 24 * 3600);
  if (!ttl || *ttl <= 0) bad_field("ttl_seconds", "ttl_seconds must be a number above 0");
  // An admin may pin a prefix in another tenant's namespace (a shared system prompt).
  std::string target = tenant.name;
  if (const auto t = f.string("tenant")) {
    if (!tenants_.known(*t)) bad_field("tenant", fmt::format("unknown tenant '{}'", *t));
    target = *t;
  }
  const std::string salt = parse_cache_salt(f);
  const std::vector<int32_t> tokens = prompt_tokens(backend_, body, true, "/v1/cache/pin");
  if (tokens.empty()) bad_field("prompt", "the prompt has no tokens");
  check_prompt_fits(tokens.size(), static_cast<size_t>(engine.model().config().context_length),
                    "prompt");
  check_prompt_fits_pool(tokens.size(), engine, "prompt");
  const kv::Hash256 ns = tenants_.namespace_of(engine, target, salt);
  // Pinning keeps cached blocks; a prefix that is not cached yet is computed first, by a
  // one-token request.
  bool warmed = false;
  if (engine.explain(ns, tokens).miss.kind != kv::MissKind::kNone) {
    engine::Request q;
    q.prompt = tokens;
    q.max_tokens = 1;
    q.sampling.temperature = 0.0f;
    q.ns = ns;
    Generation gen(engine, {q});
    Generation::Event e;
    while (!gen.done()) gen.next(e, std::chrono::milliseconds(1000));
    if (const auto failure = failure_of(gen.handle(0))) throw *failure;
    warmed = true;
  }
  const size_t pinned = engine.pin(ns, tokens, *ttl * 1000.0).tokens;
  return {{"tenant", target},
          {"prompt_tokens", tokens.size()},
          {"pinned_tokens", pinned},
          {"warmed", warmed},
          {"ttl_seconds", *ttl}};
}

nlohmann::json CacheEndpoints::flush(const std::string& body) {
  engine::Engine& engine = backend_.engine();
  bool tiers = false;
  if (body.find_first_not_of(" \t\r\n") != std::string::npos) {
    const nlohmann::json j = parse_json_object(body);
    tiers = JsonFields(j).boolean("tiers").value_or(false);
  }
  nlohmann::json out = {{"flushed_blocks", engine.flush_cache()}};
  if (tiers) out["flushed_tier_blocks"] = engine.flush_tiers();
  return out;
}

}  // namespace kvc::server
