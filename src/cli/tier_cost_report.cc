#include "cli/tier_cost_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/engine.h"
#include "kv/disk_store.h"
#include "kv/redis_store.h"
#include "model/llama_model.h"
#include "model/model_fingerprint.h"
#include "model/tokenizer.h"

namespace kvc::cli {
namespace {

constexpr int kProbes = 20;

// The median time of a load of a probe block from store, or NaN when the tier cannot be used.
template <typename Store, typename Erase>
double probe_load_ms(Store& store, size_t block_bytes, uint32_t tokens, Erase erase) {
  kv::Hash256 ns{};
  ns.fill(0xff);  // no request's namespace: those are hashes of tenant names
  std::vector<uint8_t> block(block_bytes);
  for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<uint8_t>(i * 131 + 7);
  std::vector<double> ms;
  for (int i = 0; i < kProbes; ++i) {
    kv::Hash256 h{};
    h.fill(0xfe);
    h[0] = static_cast<uint8_t>(i);
    if (!store.put(ns, h, tokens, block)) continue;
    const auto start = std::chrono::steady_clock::now();
    const bool ok = store.get(ns, h, block);
    const auto end = std::chrono::steady_clock::now();
    if (ok) ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
    erase(ns, h);
  }
  if (ms.empty()) return std::nan("");
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::string reuse_text(double threshold) {
  return std::isfinite(threshold) ? fmt::format("{:.3f}", threshold) : "never";
}

}  // namespace

std::string tier_cost_report(const std::string& model_path, const TierArgs& tiers, DType k_dtype,
                             DType v_dtype, int block_tokens, int threads, bool json) {
  const auto model = model::LlamaModel::load(model_path);
  const auto tokenizer = model::Tokenizer::from_gguf(model->file());
  engine::EngineOptions eo;
  apply_tier_options(tiers, eo);
  eo.block_tokens = block_tokens;
  eo.kv_k_dtype = k_dtype;
  eo.kv_v_dtype = v_dtype;
  eo.threads = threads;
  eo.max_running = 1;
  const engine::TierOptions tier_options = eo.kv_tiers;
  // The engine times its start-up passes only when it has a tier; the stores below are probed
  // separately, so the engine needs none of its own beyond a scratch directory.
  const kv::KvGeometry g = model->config().kv_geometry(eo.kv_k_dtype, eo.kv_v_dtype, block_tokens);
  kv::TierIdentity id;
  id.model_fingerprint = model::model_fingerprint(model->file());
  id.geometry = g;
  const auto tokens = static_cast<uint32_t>(block_tokens);

  double disk_ms = std::nan("");
  double redis_ms = std::nan("");
  if (!tier_options.disk_dir.empty()) {
    kv::DiskStore disk(tier_options.disk_dir,
                       kv::TierCodec(id, tier_options.disk_compression, tier_options.key),
                       tier_options.disk_max_bytes);
    disk_ms = probe_load_ms(disk, g.bytes_per_block(), tokens,
                            [&](const kv::Hash256&, const kv::Hash256& h) { disk.erase(h); });
  }
  if (!tier_options.redis_url.empty()) {
    kv::RedisStoreOptions ro;
    ro.address = kv::parse_redis_url(tier_options.redis_url);
    if (!tier_options.redis_password.empty()) ro.address.password = tier_options.redis_password;
    ro.timeout_ms = tier_options.redis_timeout_ms;
    kv::RedisStore redis(kv::TierCodec(id, tier_options.redis_compression, tier_options.key), ro);
    redis_ms =
        probe_load_ms(redis, g.bytes_per_block(), tokens,
                      [&](const kv::Hash256& ns, const kv::Hash256& h) { redis.erase(ns, h); });
  }

  engine::Engine engine(*model, tokenizer, eo);
  const engine::CostModelSnapshot fit = engine.stats().tiers.cost;
  const auto recompute_ms = [&](double depth) {
    return fit.block_recompute_ms(static_cast<size_t>(block_tokens), depth);
  };
  const auto break_even = [&](double load, double depth) {
    const double saving = recompute_ms(depth) - load;
    return std::isnan(load) || saving <= 0 ? std::numeric_limits<double>::infinity()
                                           : load / saving;
  };
  std::vector<size_t> depths = {0};
  for (size_t d = 512; d < static_cast<size_t>(model->config().context_length); d *= 2) {
    depths.push_back(d);
  }
  if (json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const size_t d : depths) {
      nlohmann::json r = {{"depth", d}, {"recompute_ms", recompute_ms(static_cast<double>(d))}};
      if (!std::isnan(disk_ms)) {
        r["disk_load_ms"] = disk_ms;
        const double t = break_even(disk_ms, static_cast<double>(d));
        r["disk_break_even_reuse"] = std::isfinite(t) ? nlohmann::json(t) : nlohmann::json();
      }
      if (!std::isnan(redis_ms)) {
        r["redis_load_ms"] = redis_ms;
        const double t = break_even(redis_ms, static_cast<double>(d));
        r["redis_break_even_reuse"] = std::isfinite(t) ? nlohmann::json(t) : nlohmann::json();
      }
      rows.push_back(r);
    }
    return nlohmann::json{{"block_tokens", block_tokens},
                          {"threads", threads},
                          {"passes", fit.passes},
                          {"pass_ms", fit.pass_ms},
                          {"token_ms", fit.token_ms},
                          {"depth_ms", fit.depth_ms},
                          {"depths", rows}}
               .dump(2) +
           "\n";
  }
  std::string out = fmt::format(
      "Drop or keep: a {}-token block of {} ({}/{} K/V), {} threads; recompute fitted from {} "
      "timed "
      "passes, loads timed with {} probe blocks.\n"
      "A tier pays for a block when the chance it is reused exceeds the break-even figure "
      "(the write, taken as one load, over what a hit saves); 'never' when recomputing is "
      "faster than loading.\n\n",
      block_tokens, model_path, dtype_name(g.k_dtype), dtype_name(g.v_dtype), threads, fit.passes,
      kProbes);
  out += fmt::format("{:>8}  {:>13}", "depth", "recompute ms");
  if (!std::isnan(disk_ms))
    out += fmt::format("  {:>12}  {:>17}", "disk load ms", "disk break-even");
  if (!std::isnan(redis_ms))
    out += fmt::format("  {:>13}  {:>18}", "redis load ms", "redis break-even");
  out += "\n";
  for (const size_t d : depths) {
    const auto depth = static_cast<double>(d);
    out += fmt::format("{:>8}  {:>13.4f}", d, recompute_ms(depth));
    if (!std::isnan(disk_ms)) {
      out += fmt::format("  {:>12.4f}  {:>17}", disk_ms, reuse_text(break_even(disk_ms, depth)));
    }
    if (!std::isnan(redis_ms)) {
      out += fmt::format("  {:>13.4f}  {:>18}", redis_ms, reuse_text(break_even(redis_ms, depth)));
    }
    out += "\n";
  }
  if (!tier_options.redis_url.empty() && std::isnan(redis_ms)) {
    out += "Redis could not be reached: no figures for it.\n";
  }
  return out;
}

}  // namespace kvc::cli
