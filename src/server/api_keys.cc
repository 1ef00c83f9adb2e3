#include "server/api_keys.h"

#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "base/error.h"

namespace kvc::server {

namespace {

kv::Hash256 digest(std::string_view key) {
  kv::Hasher h;
  h.str(key);
  return h.finish();
}

bool valid_tenant(const std::string& name) {
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return !name.empty();
}

}  // namespace

ApiKeys ApiKeys::parse(std::string_view text, const std::string& label) {
  ApiKeys keys;
  std::map<kv::Hash256, int> line_of;
  std::istringstream in{std::string(text)};
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string w; fields >> w;) f.push_back(w);
    if (f.empty() || f[0].front() == '#') continue;
    if (f.size() < 2 || f.size() > 3 || (f.size() == 3 && f[2] != "admin")) {
      fail("{}:{}: expected 'KEY TENANT [admin]', got '{}'", label, number, line);
    }
    if (!valid_tenant(f[1])) {
      fail("{}:{}: tenant name '{}' may hold only letters, digits, '.', '_' and '-'", label, number,
           f[1]);
    }
    const kv::Hash256 h = digest(f[0]);
    if (auto it = line_of.find(h); it != line_of.end()) {
      fail("{}:{}: this key is already given on line {}", label, number, it->second);
    }
    line_of[h] = number;
    keys.tenants_[h] = Tenant{f[1], f.size() == 3};
  }
  return keys;
}

ApiKeys ApiKeys::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read API keys file '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  ApiKeys keys = parse(ss.str(), path);
  if (keys.size() == 0) fail("API keys file '{}' has no keys", path);
  return keys;
}

std::optional<Tenant> ApiKeys::find(std::string_view key) const {
  auto it = tenants_.find(digest(key));
  if (it == tenants_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> ApiKeys::tenant_names() const {
  std::set<std::string> names;
  for (const auto& [h, t] : tenants_) names.insert(t.name);
  return {names.begin(), names.end()};
}

}  // namespace kvc::server
