// Tenants: who is calling (from the bearer key), and the prefix-cache namespaces each tenant's
// requests use (its own, and one per cache_salt), parsed and validated in one place.
//
// Thread-safety: authenticate() and the parsing functions are pure. Tenants is thread-safe:
// one mutex guards its namespace table, held only to read or update it (engine calls happen
// outside it, except namespace_stats while pruning, which never waits for a step).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "engine/engine.h"
#include "kv/content_hash.h"
#include "server/api_keys.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"

namespace kvc::server {

// The one tenant when the server runs without keys.
inline constexpr const char* kAnonymousTenant = "anonymous";

// The caller's tenant from its Authorization header value ("" when absent). Without keys every
// caller is the anonymous admin tenant. Throws ApiError 401 without a valid key, and 403 when
// need_admin and the key is not an admin key.
Tenant authenticate(const std::optional<ApiKeys>& keys, const std::string& authorization,
                    bool need_admin);

// A body's "cache_salt": "" when absent; throws 400 unless it is a string of 1 to 1024
// characters.
std::string parse_cache_salt(const JsonFields& fields);

class Tenants {
 public:
  // At most this many namespaces are remembered per tenant: beyond it, namespaces that hold
  // no blocks and no pins (the engine dropped them) are forgotten.
  static constexpr size_t kMaxNamespacesPerTenant = 64;

  explicit Tenants(std::optional<ApiKeys> keys) : keys_(std::move(keys)) {}

  const std::optional<ApiKeys>& keys() const { return keys_; }
  Tenant authenticate(const std::string& authorization, bool need_admin) const {
    return server::authenticate(keys_, authorization, need_admin);
  }
  // Every tenant name, sorted (the anonymous one without keys).
  std::vector<std::string> names() const;
  bool known(const std::string& name) const;

  // The namespace of a tenant's requests with cache_salt ("" for none), remembered for the
  // tenant's figures. The salt is the tenant's name (nothing for the anonymous tenant), then
  // the cache_salt after a newline, which no tenant name holds, so no two pairs collide.
  kv::Hash256 namespace_of(const engine::Engine& engine, const std::string& tenant,
                           const std::string& cache_salt);
  // The namespaces a tenant used.
  std::set<kv::Hash256> namespaces(const std::string& tenant) const;
  // A tenant's figures summed over its namespaces.
  kv::NamespaceStats stats(const engine::Engine& engine, const std::string& tenant) const;
  // Every tenant with its namespaces (tenants without requests yet included), for /metrics.
  std::vector<TenantNamespaces> for_metrics() const;

 private:
  const std::optional<ApiKeys> keys_;
  mutable Mutex mu_;
  std::map<std::string, std::set<kv::Hash256>> namespaces_ GUARDED_BY(mu_);
};

}  // namespace kvc::server
