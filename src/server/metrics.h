// /metrics: the engine's state in the Prometheus text exposition format 0.0.4.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/histogram.h"
#include "engine/engine.h"

namespace kvc::server {

// Writes metric families: a HELP and a TYPE line, then the family's samples.
class PrometheusText {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  // Starts a family; type is "counter", "gauge" or "histogram".
  void family(const std::string& name, const std::string& type, const std::string& help);
  // One sample line `name{labels} value` of the current family.
  void sample(const std::string& name, const Labels& labels, double value);
  // A whole histogram family: cumulative _bucket lines ending with le="+Inf", _sum and _count.
  // Bounds and sum are multiplied by scale (milliseconds to seconds: 1e-3).
  void histogram(const std::string& name, const std::string& help, const Histogram::Snapshot& s,
                 double scale);
  // Everything written so far.
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

// The prefix-cache namespaces of one tenant (its own, and one per cache_salt it used).
struct TenantNamespaces {
  std::string tenant;
  std::vector<kv::Hash256> namespaces;
};

// Everything /metrics shows: KV blocks by state and usage, prefix-cache queried and hit tokens
// in total and per tenant, evictions, preemptions, requests running and waiting, request and
// token counters, HTTP responses by status, and the TTFT, inter-token, end-to-end and queue
// latency histograms in seconds.
std::string render_metrics(const engine::Engine& engine, const std::string& model_id,
                           const std::vector<TenantNamespaces>& tenants,
                           const std::map<int, uint64_t>& http_responses);

// /metrics in the tokenizer-only mode, where there is no engine: kvcache_info (with
// mode="tokenizer-only") and HTTP responses by status.
std::string render_tokenizer_only_metrics(const std::string& model_id,
                                          const std::map<int, uint64_t>& http_responses);

// The Content-Type of the text format.
inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace kvc::server
