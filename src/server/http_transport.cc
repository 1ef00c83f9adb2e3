#include "server/http_transport.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <string_view>

#include "server/api_error.h"
#include "server/openai_protocol.h"

namespace kvc::server {

using Clock = std::chrono::steady_clock;

struct HttpTransport::Connection {
  socket_t fd = -1;
  std::string client;  // the peer's address, without its port
  Phase phase = Phase::kHeaders;
  Clock::time_point phase_since;
  bool registered = false;
  bool evicted = false;    // closed by the server to make room
  bool timed_out = false;  // the current request's headers or body came too slowly
  Phase timed_out_in = Phase::kHeaders;
  bool close_after = false;   // close once the current response is written
  size_t request_bytes = 0;   // bytes of the current request read so far
  Clock::time_point read_at;  // when the current request was read whole
  // The client closed its sending side with its request (`nc -N`): it still reads answers.
  bool half_closed = false;
};

namespace {

thread_local HttpTransport::Connection* t_connection = nullptr;
thread_local HttpTransport* t_transport = nullptr;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// How long after its request was read a client's end of stream still counts as a half-close
// that came with the request (`nc -N` sends its FIN right behind the request): such a client
// waits for its answer, while one whose end of stream comes later has given up.
constexpr auto kHalfCloseGrace = std::chrono::milliseconds(250);

// Waits until fd is ready for events or deadline passes: >0 ready, 0 timed out, <0 error.
// revents, when given, receives what poll reported.
int poll_until(socket_t fd, short events, Clock::time_point deadline, short* revents = nullptr) {
  for (;;) {
    const auto left = deadline - Clock::now();
    const int ms = left <= Clock::duration::zero()
                       ? 0
                       : static_cast<int>(std::min<int64_t>(
                             std::chrono::ceil<std::chrono::milliseconds>(left).count(), 60000));
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && Clock::now() < deadline) continue;
    if (revents) *revents = r > 0 ? p.revents : 0;
    return r;
  }
}

std::string peer_address(socket_t fd, int* port = nullptr) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "unknown";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    if (port) *port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    if (port) *port = ntohs(a->sin6_port);
  }
  return text;
}

std::string local_address(socket_t fd, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  port = 0;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    port = ntohs(a->sin6_port);
  }
  return text;
}

// A whole response written straight to a socket, for connections refused before any request.
std::string canned_response(int status, const char* reason, const ApiError& e) {
  const std::string body = dump_json(e.to_json());
  std::string out = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
      "Connection: close\r\n",
      status, reason, body.size());
  if (status == 429 || status == 503) out += "Retry-After: 1\r\n";
  return out + "\r\n" + body;
}

void send_all(socket_t fd, const std::string& data) {
  size_t off = 0;
  const auto deadline = Clock::now() + std::chrono::milliseconds(500);
  while (off < data.size()) {
    if (poll_until(fd, POLLOUT, deadline) <= 0) return;
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// One thread per connection, started at once, up to max threads; never a queue of
// connections behind slow ones while there is room.
class ConnectionThreads final : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(size_t max_threads) : max_(max_threads) {}
  ~ConnectionThreads() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      MutexLock lock(mu_);
      jobs_.push_back(std::move(fn));
      if (jobs_.size() > idle_ && threads_.size() < max_) {
        threads_.emplace_back([this] { work(); });
      }
    }
    cv_.notify_one();
  }

  void shutdown() override {
    std::vector<std::thread> threads;
    {
      MutexLock lock(mu_);
      stop_ = true;
      threads.swap(threads_);
    }
    cv_.notify_all();
    for (auto& t : threads) t.join();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        MutexLock lock(mu_);
        ++idle_;
        while (!stop_ && jobs_.empty()) cv_.wait(lock);
        --idle_;
        if (jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }

  const size_t max_;
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> jobs_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
  size_t idle_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
};

// Threads beyond max_connections that only refuse or evict, so that a full server still
// answers new connections at once.
constexpr size_t kSpareThreads = 16;

}  // namespace

// A socket stream whose buffer lives as long as the connection (pipelined requests are not
// lost) and whose reads give up at the current phase's deadline, not per read.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(HttpTransport& transport, HttpTransport::Connection& c)
      : transport_(transport), c_(c), buffer_(16384) {}

  void start_request(Clock::time_point deadline) {
    deadline_ = deadline;
    tail_ = 0;
    c_.request_bytes = 0;
    c_.read_at = Clock::now();
  }
  bool buffered() const { return off_ < len_; }
  // Waits for the first byte of the next request; false when none came before deadline.
  bool wait_for_request(Clock::time_point deadline) const {
    return poll_until(c_.fd, POLLIN, deadline) > 0;
  }

  bool is_readable() const override {
    return buffered() || poll_until(c_.fd, POLLIN, deadline_) > 0;
  }
  // Writable within the write timeout and not reset. The end of the client's stream is no
  // reason to stop: a client that half-closed after its request (shutdown(SHUT_WR), as
  // `nc -N` does) still reads the answer. One that closed altogether answers the next write
  // with a reset, which fails the write after it; HttpTransport::client_gone() finds it sooner
  // while an answer is being prepared.
  bool is_writable() const override {
    short revents = 0;
    if (poll_until(c_.fd, POLLOUT, Clock::now() + seconds(transport_.options_.write_timeout_s),
                   &revents) <= 0) {
      return false;
    }
    return (revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (!buffered()) {
      const Clock::time_point deadline =
          c_.phase == HttpTransport::Phase::kAnswering
              ? Clock::now() + seconds(transport_.options_.body_timeout_s)
              : deadline_;
      const int r = poll_until(c_.fd, POLLIN, deadline);
      if (r == 0) {
        if (!c_.evicted) {
          c_.timed_out = true;
          c_.timed_out_in = c_.phase;
        }
        return -1;
      }
      if (r < 0) return -1;
      const ssize_t n = ::recv(c_.fd, buffer_.data(), buffer_.size(), 0);
      if (n <= 0) return n;
      off_ = 0;
      len_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, len_ - off_);
    std::memcpy(ptr, buffer_.data() + off_, n);
    off_ += n;
    c_.request_bytes += n;
    if (c_.phase == HttpTransport::Phase::kHeaders) scan(ptr, n);
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    // An interim response ("100 Continue" to Expect: 100-continue) comes before the body is
    // read: the body's deadline, and eviction, still apply until it is.
    constexpr std::string_view kInterim = "HTTP/1.1 1";
    const bool interim = c_.phase != HttpTransport::Phase::kAnswering && size >= kInterim.size() &&
                         std::string_view(ptr, kInterim.size()) == kInterim;
    if (c_.phase != HttpTransport::Phase::kAnswering && !interim) {
      transport_.set_phase(c_, HttpTransport::Phase::kAnswering);
    }
    if (!is_writable()) return -1;
    return ::send(c_.fd, ptr, size, MSG_NOSIGNAL);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    port = 0;
    ip = peer_address(c_.fd, &port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = local_address(c_.fd, port);
  }
  socket_t socket() const override { return c_.fd; }

 private:
  // Watches for the blank line that ends the headers: the body's own deadline starts there.
  void scan(const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      tail_ = (tail_ << 8) | static_cast<unsigned char>(p[i]);
      if ((tail_ & 0xffffffffu) == 0x0d0a0d0au || (tail_ & 0xffffu) == 0x0a0au) {
        transport_.set_phase(c_, HttpTransport::Phase::kBody);
        deadline_ = Clock::now() + seconds(transport_.options_.body_timeout_s);
        return;
      }
    }
  }

  HttpTransport& transport_;
  HttpTransport::Connection& c_;
  std::vector<char> buffer_;
  size_t off_ = 0, len_ = 0;
  Clock::time_point deadline_;
  uint64_t tail_ = 0;
};

HttpTransport::HttpTransport(TransportOptions options) : options_(options) {
  const size_t threads = options_.max_connections + kSpareThreads;
  new_task_queue = [threads] { return new ConnectionThreads(threads); };
  set_write_timeout(static_cast<time_t>(options_.write_timeout_s));
}

HttpTransport::~HttpTransport() = default;

bool HttpTransport::listen_with_backlog() {
  // cpp-httplib listens with a backlog of 5: a burst of connections would wait for SYN
  // retries (1 s and more) before the accept loop sees them.
  if (svr_sock_ != INVALID_SOCKET) ::listen(svr_sock_, 1024);
  return listen_after_bind();
}

void HttpTransport::stop_connections() {
  MutexLock lock(mu_);
  stopping_ = true;
  // Connections still waiting for (or reading) a request will not be answered any more.
  for (Connection* c : connections_) {
    if (c->phase != Phase::kAnswering) ::shutdown(c->fd, SHUT_RDWR);
  }
}

ConnectionCounts HttpTransport::counts() const {
  MutexLock lock(mu_);
  ConnectionCounts out = counts_;
  out.open = connections_.size();
  out.waiting = 0;
  for (const Connection* c : connections_) {
    if (c->phase != Phase::kAnswering) ++out.waiting;
  }
  return out;
}

bool HttpTransport::admit(Connection& c, std::string& refusal) {
  MutexLock lock(mu_);
  if (stopping_) {
    refusal = canned_response(
        503, "Service Unavailable",
        ApiError(503, "server_error", "the server is shutting down", "", "shutting_down"));
    return false;
  }
  const size_t cap = options_.max_connections_per_client;
  if (cap > 0 && per_client_[c.client] >= cap) {
    ++counts_.refused_per_client;
    refusal = canned_response(
        429, "Too Many Requests",
        ApiError(429, "rate_limit_error",
                 fmt::format("this client address ({}) already has {} connections open, the "
                             "limit (--max-connections-per-client)",
                             c.client, cap),
                 "", "too_many_connections"));
    return false;
  }
  if (live_ >= options_.max_connections) {
    // Room for a request that arrives whole: the oldest connection that is only waiting
    // (idle first, then reading headers, then a body) gives way.
    Connection* victim = nullptr;
    for (Connection* o : connections_) {
      if (o->evicted || o->phase == Phase::kAnswering) continue;
      if (!victim || o->phase < victim->phase ||
          (o->phase == victim->phase && o->phase_since < victim->phase_since)) {
        victim = o;
      }
    }
    if (!victim) {
      ++counts_.refused_full;
      refusal =
          canned_response(503, "Service Unavailable",
                          ApiError(503, "server_error",
                                   fmt::format("the server is answering {} connections, the limit "
                                               "(--max-connections); retry shortly",
                                               options_.max_connections),
                                   "", "too_many_connections"));
      return false;
    }
    victim->evicted = true;
    ::shutdown(victim->fd, SHUT_RDWR);
    ++counts_.evicted;
    --live_;
    --per_client_[victim->client];
  }
  c.registered = true;
  c.phase = Phase::kHeaders;
  c.phase_since = Clock::now();
  connections_.push_back(&c);
  ++live_;
  ++per_client_[c.client];
  return true;
}

void HttpTransport::release(Connection& c) {
  if (!c.registered) return;
  MutexLock lock(mu_);
  connections_.remove(&c);
  if (!c.evicted) {
    --live_;
    if (--per_client_[c.client] == 0) per_client_.erase(c.client);
  } else if (per_client_[c.client] == 0) {
    per_client_.erase(c.client);
  }
  if (c.timed_out) ++counts_.timed_out;
}

bool HttpTransport::set_phase(Connection& c, Phase phase) {
  MutexLock lock(mu_);
  c.phase = phase;
  c.phase_since = Clock::now();
  return !(stopping_ && phase == Phase::kIdle) && !c.evicted;
}

bool HttpTransport::process_and_close_socket(socket_t sock) {
  Connection c;
  c.fd = sock;
  c.client = peer_address(sock);
  std::string refusal;
  bool ok = false;
  if (!admit(c, refusal)) {
    send_all(sock, refusal);
  } else {
    t_connection = &c;
    t_transport = this;
    DeadlineStream strm(*this, c);
    // The first request's headers are due header_timeout after the connection opened.
    Clock::time_point deadline = Clock::now() + seconds(options_.header_timeout_s);
    for (size_t served = 0; served < options_.max_requests_per_connection; ++served) {
      if (served > 0) {
        if (!set_phase(c, Phase::kIdle)) break;
        if (!strm.buffered() &&
            !strm.wait_for_request(Clock::now() + seconds(options_.keep_alive_timeout_s))) {
          break;
        }
        if (svr_sock_ == INVALID_SOCKET) break;
        deadline = Clock::now() + seconds(options_.header_timeout_s);
        if (!set_phase(c, Phase::kHeaders)) break;
      }
      strm.start_request(deadline);
      c.timed_out = false;
      c.close_after = false;
      bool closed = false;
      const bool last = served + 1 >= options_.max_requests_per_connection;
      ok = process_request(strm, last, closed, nullptr);
      if (!ok && c.timed_out && c.request_bytes > 0 && c.timed_out_in == Phase::kHeaders &&
          c.phase != Phase::kAnswering) {
        // The request line itself never ended: cpp-httplib gives up without a word.
        send_all(sock, canned_response(408, "Request Timeout",
                                       ApiError(408, "invalid_request_error", timeout_description(),
                                                "", "request_timeout")));
      }
      if (!ok || closed || c.close_after || c.evicted) break;
    }
    t_connection = nullptr;
    t_transport = nullptr;
    release(c);
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

bool HttpTransport::request_timed_out() {
  return t_connection && t_connection->timed_out;
}

std::string HttpTransport::timeout_description() {
  if (!t_connection || !t_transport) return "the request timed out";
  if (t_connection->timed_out_in == Phase::kHeaders) {
    return fmt::format("the request's headers did not arrive within {} s (--header-timeout)",
                       t_transport->options_.header_timeout_s);
  }
  return fmt::format(
      "the request's body did not arrive within {} s of its headers "
      "(--body-timeout)",
      t_transport->options_.body_timeout_s);
}

void HttpTransport::request_read() {
  if (!t_connection || !t_transport) return;
  t_transport->set_phase(*t_connection, Phase::kAnswering);
  t_connection->read_at = Clock::now();
}

bool HttpTransport::client_gone() {
  Connection* c = t_connection;
  if (!c) return false;
  pollfd p{c->fd, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  // Reset: gone, whatever it sent before.
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
  if (!(p.revents & POLLRDHUP) || c->half_closed) return false;
  // The end of the client's stream: with the request, a half-close; later, the client left.
  if (Clock::now() - c->read_at <= kHalfCloseGrace) {
    c->half_closed = true;
    return false;
  }
  return true;
}

void HttpTransport::close_after_response() {
  if (t_connection) t_connection->close_after = true;
}

}  // namespace kvc::server
