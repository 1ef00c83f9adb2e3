// The cache endpoints over the engine: GET /v1/cache (figures), POST /v1/cache/explain (would
// this prompt hit, and why not), POST /v1/cache/pin (keep a prefix cached for a while, warming
// it first) and POST /v1/cache/flush. Callers authenticate first; pin and flush are for admins.
// In the tokenizer-only mode (no engine) each refuses with Backend::engine()'s 400 before
// reading the request.
//
// A tenant sees only its own figures; the pool's and every tenant's together (which move when
// other tenants' requests run, and so would tell one tenant about another's) are for admins.
//
// Thread-safety: every method may be called from any thread; the state is the engine's (whose
// cache operations never wait for a forward pass) and the Tenants table (thread-safe).
#pragma once

#include <nlohmann/json.hpp>

#include "server/api_keys.h"
#include "server/backend.h"
#include "server/tenant.h"

namespace kvc::server {

class CacheEndpoints {
 public:
  // backend and tenants must outlive the endpoints.
  CacheEndpoints(const Backend& backend, Tenants& tenants) : backend_(backend), tenants_(tenants) {}

  nlohmann::json stats(const Tenant& tenant) const;
  nlohmann::json explain(const Tenant& tenant, const nlohmann::json& body);
  // Blocks until a prefix that is not cached yet has been computed (a one-token request).
  nlohmann::json pin(const Tenant& tenant, const nlohmann::json& body);
  // Evicts every unreferenced block; with {"tiers": true} also deletes the lower tiers' blocks.
  nlohmann::json flush(const std::string& body);

 private:
  const Backend& backend_;
  Tenants& tenants_;
};

}  // namespace kvc::server
