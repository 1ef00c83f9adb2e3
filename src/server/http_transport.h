// The connection layer under the HTTP routes: which connections are served, on which thread,
// and for how long a request may take to arrive.
//
// cpp-httplib serves each connection on one blocking thread, and reads a request with a
// per-read timeout only, so a client that sends its headers one byte a second holds a thread
// forever, and a handful of such clients hold them all. HttpTransport replaces its
// per-connection loop:
//  - every connection gets its own thread at once (up to max_connections, plus a few that only
//    refuse), so a slow connection never keeps a whole request waiting in a queue;
//  - a request's headers must arrive within header_timeout and its body within body_timeout
//    of its headers (408 otherwise), whatever the pace of the bytes;
//  - a client address holds at most max_connections_per_client connections (429 and close
//    beyond it), and the server at most max_connections: at the cap a new connection takes the
//    place of the oldest one that is still waiting for, or reading, a request (idle keep-alive
//    connections first), so requests that arrive whole always find room; only when every
//    connection is busy answering is a new one refused (503);
//  - pipelined requests (several in one write) are answered in order: the read buffer lives as
//    long as the connection, not one request.
//
// Thread-safety: configure (routes, handlers, options) before listening; afterwards every
// public function may be called from any thread. The connection table is guarded by one
// mutex, held only to count, change a connection's phase, or pick a connection to close.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"

namespace kvc::server {

struct TransportOptions {
  double header_timeout_s = 10;             // --header-timeout: request line and headers
  double body_timeout_s = 30;               // --body-timeout: the body, from the end of the headers
  double keep_alive_timeout_s = 2;          // an idle connection's wait for its next request
  double write_timeout_s = 10;              // one blocked write to a client
  size_t max_connections = 512;             // --max-connections
  size_t max_connections_per_client = 128;  // --max-connections-per-client; 0: no cap
  size_t max_requests_per_connection = 1000;
};

// Connections by what they are doing, for /metrics and tests.
struct ConnectionCounts {
  size_t open = 0;
  size_t waiting = 0;  // idle, or reading a request
  uint64_t refused_per_client = 0;
  uint64_t refused_full = 0;
  uint64_t evicted = 0;
  uint64_t timed_out = 0;
};

class HttpTransport : public httplib::Server {
 public:
  explicit HttpTransport(TransportOptions options);
  ~HttpTransport() override;

  // Widens the listen backlog (cpp-httplib's is 5), then serves until stop(); call after
  // bind_to_port or bind_to_any_port.
  bool listen_with_backlog();
  // From now on connections that wait for or read a request close, and the others close after
  // their current response.
  void stop_connections();
  ConnectionCounts counts() const;
  const TransportOptions& transport_options() const { return options_; }

  // What the calling thread's connection knows about its current request (handlers and the
  // error handler run on the connection's thread); all false off a connection thread.
  // Whether the request's headers or body took longer than their timeout.
  static bool request_timed_out();
  // Which timeout it was: "--header-timeout" or "--body-timeout" and its seconds.
  static std::string timeout_description();
  // Marks the request as read (it is then answered, never evicted).
  static void request_read();
  // Whether the client has gone while its answer is being prepared: its connection was reset,
  // or it closed its sending side more than a moment (250 ms) after its request was read. A
  // client that half-closes right behind its request (shutdown(SHUT_WR), as `nc -N` does) is
  // still there: over TCP a half-close and a close look the same until a write, but such a
  // client sends its FIN with the request, while one that gives up does so later.
  static bool client_gone();
  // Closes the connection after this response (a body left unread, for example).
  static void close_after_response();

  enum class Phase { kIdle, kHeaders, kBody, kAnswering };
  struct Connection;

 private:
  bool process_and_close_socket(socket_t sock) override;
  // Registers a connection; false (with the answer to send) when it is refused.
  bool admit(Connection& c, std::string& refusal);
  void release(Connection& c);
  // Sets c's phase; false when the server is stopping and c should close instead of waiting.
  bool set_phase(Connection& c, Phase phase);

  friend class DeadlineStream;

  TransportOptions options_;
  mutable Mutex mu_;
  std::list<Connection*> connections_ GUARDED_BY(mu_);
  // Connections not evicted, per address.
  std::map<std::string, size_t> per_client_ GUARDED_BY(mu_);
  size_t live_ GUARDED_BY(mu_) = 0;  // connections not evicted
  bool stopping_ GUARDED_BY(mu_) = false;
  ConnectionCounts counts_ GUARDED_BY(mu_);
};

}  // namespace kvc::server
