// Host names resolved within a deadline, for connections to shared tiers (Redis).
//
// The C library's getaddrinfo follows resolv.conf's timeouts (5 s a try, by default), which a
// connection's own timeout does not cover: a DNS server that does not answer would hold the
// step loop for seconds at every reconnect. c-ares resolves here instead, with every wait
// bounded by the caller's deadline; the hosts file is read first, as the C library reads it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvc::kv {

struct HostResolution {
  std::vector<std::string> addresses;  // numeric, in the resolver's order; empty on failure
  std::string error;                   // why nothing was found, when addresses is empty
};

// host's addresses (IPv4 and IPv6), waiting at most timeout_ms; a numeric host is returned as
// it is, with no lookup. dns_servers ("IP[:PORT],...", empty: the system's) chooses the
// servers asked.
HostResolution resolve_host(std::string_view host, double timeout_ms,
                            std::string_view dns_servers = {});

}  // namespace kvc::kv
