// A real redis-server for tests: started on a free loopback port with no persistence, killed
// or restarted on demand, stopped at the end.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace kvc::testing {

// True when a redis-server binary is on the PATH.
inline bool redis_server_available() {
  return std::system("command -v redis-server >/dev/null 2>&1") == 0;
}

class RedisServer {
 public:
  // Starts redis-server with extra arguments (e.g. {"--maxmemory", "2mb"}); check running().
  explicit RedisServer(std::vector<std::string> extra = {}) : extra_(std::move(extra)) {
    // A port found free can be taken before the server binds it (by another test's server or
    // a client's ephemeral port): then try another.
    for (int attempt = 0; attempt < 20; ++attempt) {
      port_ = free_port();
      if (start()) return;
    }
  }
  ~RedisServer() { stop(SIGKILL); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  bool running() const { return pid_ > 0; }

  // Kills the server at once (as a crash would).
  void kill() { stop(SIGKILL); }
  // Starts it again on the same port, empty.
  bool restart() {
    stop(SIGKILL);
    return start();
  }

  // A raw connection for tests to inspect or damage what is stored.
  redisContext* connect() const {
    timeval tv{1, 0};
    return redisConnectWithTimeout("127.0.0.1", port_, tv);
  }

 private:
  static int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
  }

  bool start() {
    std::vector<std::string> args = {
        "redis-server", "--port", std::to_string(port_), "--bind", "127.0.0.1",
        "--save",       "",       "--appendonly",        "no"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    const pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp("redis-server", argv.data());
      _exit(127);
    }
    pid_ = pid;
    // Ready when it answers (within 5 s), as this process: a server another test started on
    // the same port would answer too.
    for (int i = 0; i < 500; ++i) {
      redisContext* c = connect();
      if (c != nullptr && c->err == 0) {
        auto* r = static_cast<redisReply*>(redisCommand(c, "INFO server"));
        const bool answered = r != nullptr && r->type == REDIS_REPLY_STRING;
        const bool ours =
            answered &&
            std::string(r->str, r->len).find("process_id:" + std::to_string(pid_) + "\r\n") !=
                std::string::npos;
        if (r != nullptr) freeReplyObject(r);
        redisFree(c);
        if (ours) return true;
        if (answered) break;
      } else if (c != nullptr) {
        redisFree(c);
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    stop(SIGKILL);
    return false;
  }

  void stop(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::vector<std::string> extra_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace kvc::testing
