// API keys and the tenants they name, read from a file of `KEY TENANT [admin]` lines.
//
// A tenant's name salts its cache namespace, so tenants never share (or time) each other's
// cached prefixes; the admin flag allows cache pinning and flushing.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kv/content_hash.h"

namespace kvc::server {

struct Tenant {
  std::string name;
  bool admin = false;
};

class ApiKeys {
 public:
  // Parses `KEY TENANT [admin]` lines; blank lines and lines starting with '#' are skipped.
  // Throws Error naming the file and line of a malformed line, a duplicate key, or a tenant
  // name with characters other than letters, digits, '.', '_' and '-'.
  static ApiKeys parse(std::string_view text, const std::string& label);
  // Reads and parses a keys file; throws Error when it cannot be read or has no keys.
  static ApiKeys load(const std::string& path);

  // The tenant of a key, or nullopt for an unknown key.
  std::optional<Tenant> find(std::string_view key) const;
  // The number of keys.
  size_t size() const { return tenants_.size(); }
  // Every tenant name, each once, sorted.
  std::vector<std::string> tenant_names() const;

 private:
  // Keys are held as SHA-256 digests: the file's secrets are not kept in memory, and lookups
  // compare digests rather than secrets.
  std::map<kv::Hash256, Tenant> tenants_;
};

}  // namespace kvc::server
