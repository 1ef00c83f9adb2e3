#include "kv/host_resolver.h"

#include <ares.h>
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>

namespace kvc::kv {
namespace {

using Clock = std::chrono::steady_clock;

// An address, not a name (IPv6 with a scope, fe80::1%eth0, included): no lookup is made.
bool is_numeric(const std::string& host) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  freeaddrinfo(found);
  return true;
}

// ares_getaddrinfo's answer, written by its callback.
struct Answer {
  bool done = false;
  HostResolution result;
};

void on_answer(void* arg, int status, int /*timeouts*/, ares_addrinfo* info) {
  auto* answer = static_cast<Answer*>(arg);
  answer->done = true;
  if (status != ARES_SUCCESS || info == nullptr) {
    answer->result.error = ares_strerror(status);
  } else {
    for (const ares_addrinfo_node* n = info->nodes; n != nullptr; n = n->ai_next) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* where = n->ai_family == AF_INET6
                              ? static_cast<const void*>(
                                    &reinterpret_cast<const sockaddr_in6*>(n->ai_addr)->sin6_addr)
                              : &reinterpret_cast<const sockaddr_in*>(n->ai_addr)->sin_addr;
      if (inet_ntop(n->ai_family, where, text, sizeof text) != nullptr) {
        answer->result.addresses.emplace_back(text);
      }
    }
    if (answer->result.addresses.empty()) answer->result.error = "no address";
  }
  if (info != nullptr) ares_freeaddrinfo(info);
}

// Drives the channel's sockets until the answer is in or the deadline passes.
void wait_for(ares_channel channel, const Answer& answer, Clock::time_point deadline) {
  while (!answer.done) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return;
    ares_socket_t sockets[ARES_GETSOCK_MAXNUM];
    const int mask = ares_getsock(channel, sockets, ARES_GETSOCK_MAXNUM);
    pollfd fds[ARES_GETSOCK_MAXNUM];
    nfds_t n = 0;
    for (int i = 0; i < ARES_GETSOCK_MAXNUM; ++i) {
      const short events = static_cast<short>((ARES_GETSOCK_READABLE(mask, i) ? POLLIN : 0) |
                                              (ARES_GETSOCK_WRITABLE(mask, i) ? POLLOUT : 0));
      if (events != 0) fds[n++] = {sockets[i], events, 0};
    }
    // c-ares' own retry timer, so that a lost query is sent again before our deadline.
    timeval most{static_cast<time_t>(left.count() / 1000),
                 static_cast<suseconds_t>(left.count() % 1000 * 1000)};
    timeval next{};
    const timeval* wait = ares_timeout(channel, &most, &next);
    const int wait_ms = static_cast<int>(wait->tv_sec * 1000 + (wait->tv_usec + 999) / 1000);
    if (poll(fds, n, wait_ms) < 0 && errno != EINTR) return;
    // A socket with no event, or none at all, still lets c-ares run its timers.
    if (n == 0) ares_process_fd(channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
    for (nfds_t i = 0; i < n; ++i) {
      const bool readable = (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) != 0;
      const bool writable = (fds[i].revents & POLLOUT) != 0;
      ares_process_fd(channel, readable ? fds[i].fd : ARES_SOCKET_BAD,
                      writable ? fds[i].fd : ARES_SOCKET_BAD);
    }
  }
}

}  // namespace

HostResolution resolve_host(std::string_view host_view, double timeout_ms,
                            std::string_view dns_servers) {
  const std::string host(host_view);
  if (is_numeric(host)) return {{host}, {}};
  const auto deadline =
      Clock::now() + std::chrono::microseconds(static_cast<int64_t>(timeout_ms * 1000));
  static std::once_flag library;
  static int library_status = ARES_SUCCESS;
  std::call_once(library, [] { library_status = ares_library_init(ARES_LIB_INIT_ALL); });
  if (library_status != ARES_SUCCESS) return {{}, ares_strerror(library_status)};

  // Three tries within the deadline, c-ares doubling each wait (sent at 0, T/4 and 3T/4): a lost
  // datagram is sent again, a second server is asked.
  ares_options options{};
  options.timeout = std::max(1, static_cast<int>(timeout_ms / 4));
  options.tries = 3;
  ares_channel channel = nullptr;
  int status = ares_init_options(&channel, &options, ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES);
  if (status == ARES_SUCCESS && !dns_servers.empty()) {
    status = ares_set_servers_ports_csv(channel, std::string(dns_servers).c_str());
  }
  if (status != ARES_SUCCESS) {
    if (channel != nullptr) ares_destroy(channel);
    return {{}, ares_strerror(status)};
  }
  Answer answer;
  ares_addrinfo_hints hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  ares_getaddrinfo(channel, host.c_str(), nullptr, &hints, on_answer, &answer);
  wait_for(channel, answer, deadline);
  const bool answered = answer.done;
  // Ends a lookup still under way; its callback runs now with what came in (the IPv4 addresses
  // when only the IPv6 query went unanswered).
  ares_destroy(channel);
  if (!answered && answer.result.addresses.empty()) {
    return {{}, fmt::format("no answer within {} ms", timeout_ms)};
  }
  return answer.result;
}

}  // namespace kvc::kv
