#include "server/tenant.h"

#include <fmt/format.h>
#include <strings.h>

#include <algorithm>

#include "server/api_error.h"

namespace kvc::server {

Tenant authenticate(const std::optional<ApiKeys>& keys, const std::string& header,
                    bool need_admin) {
  if (!keys) return Tenant{kAnonymousTenant, true};
  if (header.empty()) {
    throw ApiError(401, "invalid_request_error",
                   "missing API key: send the header 'Authorization: Bearer KEY'", "",
                   "invalid_api_key");
  }
  if (header.size() < 8 || strncasecmp(header.c_str(), "Bearer ", 7) != 0) {
    throw ApiError(401, "invalid_request_error", "the Authorization header must be 'Bearer KEY'",
                   "", "invalid_api_key");
  }
  const std::optional<Tenant> t = keys->find(header.substr(7));
  if (!t) throw ApiError(401, "invalid_request_error", "invalid API key", "", "invalid_api_key");
  if (need_admin && !t->admin) {
    throw ApiError(
        403, "permission_error",
        fmt::format("this endpoint needs an admin key; tenant '{}' is not an admin", t->name), "",
        "forbidden");
  }
  return *t;
}

std::string parse_cache_salt(const JsonFields& f) {
  const auto s = f.string("cache_salt");
  if (!s) return "";
  if (s->empty() || s->size() > 1024) {
    bad_field(f.param("cache_salt"), "cache_salt must hold 1 to 1024 characters");
  }
  return *s;
}

std::vector<std::string> Tenants::names() const {
  return keys_ ? keys_->tenant_names() : std::vector<std::string>{kAnonymousTenant};
}

bool Tenants::known(const std::string& name) const {
  const auto all = names();
  return std::find(all.begin(), all.end(), name) != all.end();
}

kv::Hash256 Tenants::namespace_of(const engine::Engine& engine, const std::string& tenant,
                                  const std::string& cache_salt) {
  std::string salt = keys_ ? tenant : "";
  if (!cache_salt.empty()) salt += "\n" + cache_salt;
  const kv::Hash256 ns = engine.namespace_for(salt);
  std::set<kv::Hash256> known;
  {
    MutexLock lock(mu_);
    auto& spaces = namespaces_[tenant];
    if (spaces.count(ns) || spaces.size() < kMaxNamespacesPerTenant) {
      spaces.insert(ns);
      return ns;
    }
    known = spaces;
  }
  // Full: forget the namespaces the engine has dropped (no blocks, no pins); their counters
  // went with them.
  std::vector<kv::Hash256> gone;
  for (const auto& n : known) {
    const kv::NamespaceStats s = engine.namespace_stats(n);
    if (s.blocks == 0 && s.pinned_blocks == 0) gone.push_back(n);
  }
  MutexLock lock(mu_);
  auto& spaces = namespaces_[tenant];
  for (const auto& n : gone) spaces.erase(n);
  if (spaces.size() < kMaxNamespacesPerTenant) spaces.insert(ns);
  return ns;
}

std::set<kv::Hash256> Tenants::namespaces(const std::string& tenant) const {
  MutexLock lock(mu_);
  auto it = namespaces_.find(tenant);
  return it == namespaces_.end() ? std::set<kv::Hash256>{} : it->second;
}

kv::NamespaceStats Tenants::stats(const engine::Engine& engine, const std::string& tenant) const {
  kv::NamespaceStats own;
  for (const auto& ns : namespaces(tenant)) {
    const kv::NamespaceStats n = engine.namespace_stats(ns);
    own.blocks += n.blocks;
    own.pinned_blocks += n.pinned_blocks;
    own.queried_tokens += n.queried_tokens;
    own.hit_tokens += n.hit_tokens;
  }
  return own;
}

std::vector<TenantNamespaces> Tenants::for_metrics() const {
  std::vector<TenantNamespaces> out;
  MutexLock lock(mu_);
  for (const auto& [name, spaces] : namespaces_)
    out.push_back({name, {spaces.begin(), spaces.end()}});
  // Tenants that have not sent a request yet still get their (zero) series.
  if (keys_) {
    for (const auto& name : keys_->tenant_names()) {
      if (!namespaces_.count(name)) out.push_back({name, {}});
    }
  }
  return out;
}

}  // namespace kvc::server
