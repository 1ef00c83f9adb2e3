// DNS servers for tests, each on a loopback UDP port: one that never answers, and one that
// answers A queries only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace kvc::testing {

// A UDP socket bound to a free loopback port.
class LoopbackUdpSocket {
 public:
  LoopbackUdpSocket() : fd_(socket(AF_INET, SOCK_DGRAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&a), len) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port_ = ntohs(a.sin_port);
    }
  }
  ~LoopbackUdpSocket() {
    if (fd_ >= 0) close(fd_);
  }
  LoopbackUdpSocket(const LoopbackUdpSocket&) = delete;
  LoopbackUdpSocket& operator=(const LoopbackUdpSocket&) = delete;

  int fd() const { return fd_; }
  bool bound() const { return port_ != 0; }
  // The address as a resolver's server list takes it.
  std::string servers() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_;
  int port_ = 0;
};

// A DNS server address that never answers: nothing reads the socket.
class SilentDnsServer : public LoopbackUdpSocket {};

// Answers every A query with 127.0.0.1 and never a AAAA one (as some broken resolvers do), so a
// lookup of both gets only the IPv4 half.
class Ipv4OnlyDnsServer {
 public:
  Ipv4OnlyDnsServer() {
    if (socket_.bound()) thread_ = std::thread([this] { serve(); });
  }
  ~Ipv4OnlyDnsServer() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  bool bound() const { return socket_.bound(); }
  std::string servers() const { return socket_.servers(); }
  int a_queries() const { return a_queries_; }
  int aaaa_queries() const { return aaaa_queries_; }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{socket_.fd(), POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      uint8_t q[512];
      sockaddr_in from{};
      socklen_t from_len = sizeof from;
      const ssize_t n =
          recvfrom(socket_.fd(), q, sizeof q, 0, reinterpret_cast<sockaddr*>(&from), &from_len);
      if (n < 12) continue;
      // The question: a name of length-prefixed labels, then its type and class.
      size_t at = 12;
      while (at < static_cast<size_t>(n) && q[at] != 0) at += q[at] + 1;
      if (at + 5 > static_cast<size_t>(n)) continue;
      const int type = q[at + 1] << 8 | q[at + 2];
      const size_t question_end = at + 5;
      if (type == 28) {
        ++aaaa_queries_;
        continue;  // AAAA: no answer, ever
      }
      if (type != 1) continue;
      ++a_queries_;
      std::vector<uint8_t> r(q, q + question_end);
      r[2] = 0x81;                                  // a response, recursion desired
      r[3] = 0x80;                                  // recursion available, no error
      r[6] = 0, r[7] = 1;                           // one answer
      r[8] = r[9] = r[10] = r[11] = 0;              // no authority or additional records
      const uint8_t answer[] = {0xc0, 12,           // the question's name
                                0,    1,  0,   1,   // A, IN
                                0,    0,  0,   60,  // TTL 60 s
                                0,    4,  127, 0,  0, 1};
      r.insert(r.end(), answer, answer + sizeof answer);
      sendto(socket_.fd(), r.data(), r.size(), 0, reinterpret_cast<sockaddr*>(&from), from_len);
    }
  }

  LoopbackUdpSocket socket_;
  std::atomic<bool> stop_{false};
  std::atomic<int> a_queries_{0}, aaaa_queries_{0};
  std::thread thread_;
};

}  // namespace kvc::testing
