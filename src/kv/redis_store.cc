#include "kv/redis_store.h"

#include <fmt/format.h>
#include <hiredis.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>

#include "base/error.h"
#include "kv/host_resolver.h"

namespace kvc::kv {
namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

timeval to_timeval(double ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms - tv.tv_sec * 1000.0) * 1000);
  return tv;
}

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r != nullptr) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

int parse_int(std::string_view s, std::string_view what, std::string_view url) {
  int v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 0) {
    fail("--kv-redis {}: the {} '{}' is not a non-negative number", url, what, s);
  }
  return v;
}

}  // namespace

RedisAddress parse_redis_url(std::string_view url) {
  constexpr std::string_view kScheme = "redis://";
  if (!url.starts_with(kScheme)) {
    fail("--kv-redis {}: expected redis://[:PASSWORD@]HOST[:PORT][/DB]", url);
  }
  std::string_view rest = url.substr(kScheme.size());
  RedisAddress a;
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view auth = rest.substr(0, at);
    rest = rest.substr(at + 1);
    // "user:password" or ":password"; Redis 5 has no users, so only the password is used.
    const size_t colon = auth.find(':');
    a.password = std::string(colon == std::string_view::npos ? auth : auth.substr(colon + 1));
  }
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) a.db = parse_int(db, "database", url);
    rest = rest.substr(0, slash);
  }
  // An IPv6 address is written in brackets ([::1]:6379), so that its colons are not the port's.
  const size_t bracket = rest.starts_with('[') ? rest.find(']') : std::string_view::npos;
  if (rest.starts_with('[') && bracket == std::string_view::npos) {
    fail("--kv-redis {}: '[' without ']'", url);
  }
  const size_t host_end = bracket == std::string_view::npos ? 0 : bracket + 1;
  if (const size_t colon = rest.rfind(':'); colon != std::string_view::npos && colon >= host_end) {
    a.port = parse_int(rest.substr(colon + 1), "port", url);
    if (a.port == 0 || a.port > 65535) fail("--kv-redis {}: port {} is out of range", url, a.port);
    rest = rest.substr(0, colon);
  }
  if (bracket != std::string_view::npos) {
    if (rest.size() != bracket + 1) fail("--kv-redis {}: text after ']' is not :PORT", url);
    rest = rest.substr(1, bracket - 1);
  }
  if (rest.empty()) fail("--kv-redis {}: no host", url);
  a.host = std::string(rest);
  return a;
}

// One connection with its backoff: a failed connect or command drops it, and it is not
// tried again before the backoff has passed.
class RedisStore::Connection {
 public:
  explicit Connection(const RedisStoreOptions& o) : o_(o), backoff_ms_(o.backoff_initial_ms) {}
  ~Connection() {
    if (ctx_ != nullptr) redisFree(ctx_);
  }

  // Runs the commands in one round trip; their replies, or empty when the connection failed
  // (then counted, dropped and backed off).
  std::vector<Reply> run(const std::vector<std::vector<std::string_view>>& commands) {
    MutexLock lock(mu_);
    std::vector<Reply> replies;
    if (!connect_locked()) return replies;
    for (const auto& args : commands) {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (std::string_view a : args) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data());
    }
    for (size_t i = 0; i < commands.size(); ++i) {
      void* r = nullptr;
      if (redisGetReply(ctx_, &r) != REDIS_OK || r == nullptr) {
        fail_locked();
        return {};
      }
      replies.emplace_back(static_cast<redisReply*>(r));
      if (replies.back()->type == REDIS_REPLY_ERROR) ++stats_.errors;
    }
    backoff_ms_ = o_.backoff_initial_ms;
    stats_.up = true;
    return replies;
  }

  RedisStoreStats stats() const {
    MutexLock lock(mu_);
    return stats_;
  }
  void count(uint64_t RedisStoreStats::*field, uint64_t n = 1) {
    MutexLock lock(mu_);
    stats_.*field += n;
  }

 private:
  bool connect_locked() REQUIRES(mu_) {
    if (ctx_ != nullptr) return true;
    if (now_ms() < down_until_ms_) {
      ++stats_.skipped;
      return false;
    }
    ++stats_.connects;
    // The name lookup and the connect share one timeout; each address found is tried in turn.
    const double start = now_ms();
    const HostResolution found = resolve_host(o_.address.host, o_.timeout_ms, o_.dns_servers);
    for (const std::string& address : found.addresses) {
      const double left = o_.timeout_ms - (now_ms() - start);
      if (left <= 0) break;
      ctx_ = redisConnectWithTimeout(address.c_str(), o_.address.port, to_timeval(left));
      if (ctx_ != nullptr && ctx_->err == 0) break;
      if (ctx_ != nullptr) redisFree(ctx_);
      ctx_ = nullptr;
    }
    if (ctx_ == nullptr || redisSetTimeout(ctx_, to_timeval(o_.timeout_ms)) != REDIS_OK) {
      fail_locked();
      return false;
    }
    redisContext* ctx = ctx_;
    auto check = [ctx](std::vector<std::string_view> args) {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (std::string_view a : args) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      Reply r(static_cast<redisReply*>(
          redisCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(), lens.data())));
      return r != nullptr && r->type != REDIS_REPLY_ERROR;
    };
    const std::string db = std::to_string(o_.address.db);
    if ((!o_.address.password.empty() && !check({"AUTH", o_.address.password})) ||
        (o_.address.db != 0 && !check({"SELECT", db}))) {
      fail_locked();
      return false;
    }
    return true;
  }

  void fail_locked() REQUIRES(mu_) {
    ++stats_.errors;
    stats_.up = false;
    if (ctx_ != nullptr) redisFree(ctx_);
    ctx_ = nullptr;
    down_until_ms_ = now_ms() + backoff_ms_;
    backoff_ms_ = std::min(o_.backoff_max_ms, backoff_ms_ * 2);
  }

  const RedisStoreOptions& o_;
  mutable Mutex mu_;
  redisContext* ctx_ GUARDED_BY(mu_) = nullptr;
  double down_until_ms_ GUARDED_BY(mu_) = 0;
  double backoff_ms_ GUARDED_BY(mu_);
  RedisStoreStats stats_ GUARDED_BY(mu_);
};

RedisStore::RedisStore(TierCodec codec, RedisStoreOptions options)
    : codec_(std::move(codec)),
      options_(std::move(options)),
      reader_(std::make_unique<Connection>(options_)),
      writer_(std::make_unique<Connection>(options_)) {}

RedisStore::~RedisStore() = default;

std::string RedisStore::key(const Hash256& ns, const Hash256& block_hash) {
  return fmt::format("kvcache:v1:{}:{}", to_hex(ns), to_hex(block_hash));
}

bool RedisStore::put(const Hash256& ns, const Hash256& block_hash, uint32_t token_count,
                     std::span<const uint8_t> payload) {
  const std::vector<uint8_t> value = codec_.encode(ns, block_hash, token_count, payload);
  const std::string k = key(ns, block_hash);
  const std::string_view v(reinterpret_cast<const char*>(value.data()), value.size());
  std::vector<std::string_view> args = {"SET", k, v};
  const std::string ttl =
      std::to_string(static_cast<uint64_t>(std::max(1.0, options_.ttl_seconds)));
  if (options_.ttl_seconds > 0) {
    args.push_back("EX");
    args.push_back(ttl);
  }
  const auto replies = writer_->run({args});
  if (replies.empty() || replies[0]->type == REDIS_REPLY_ERROR) return false;
  writer_->count(&RedisStoreStats::writes);
  writer_->count(&RedisStoreStats::bytes_written, value.size());
  return true;
}

size_t RedisStore::present_prefix(const Hash256& ns, std::span<const Hash256> hashes) {
  if (hashes.empty()) return 0;
  std::vector<std::string> keys;
  for (const Hash256& h : hashes) keys.push_back(key(ns, h));
  std::vector<std::vector<std::string_view>> commands;
  for (const std::string& k : keys) commands.push_back({"EXISTS", k});
  const auto replies = reader_->run(commands);
  size_t n = 0;
  while (n < replies.size() && replies[n]->type == REDIS_REPLY_INTEGER &&
         replies[n]->integer == 1) {
    ++n;
  }
  return n;
}

bool RedisStore::get(const Hash256& ns, const Hash256& block_hash, std::span<uint8_t> out) {
  const std::string k = key(ns, block_hash);
  const auto replies = reader_->run({{"GET", k}});
  if (replies.empty()) return false;
  const redisReply& r = *replies[0];
  if (r.type == REDIS_REPLY_NIL) {
    reader_->count(&RedisStoreStats::misses);
    return false;
  }
  if (r.type != REDIS_REPLY_STRING) return false;
  const std::span<const uint8_t> value(reinterpret_cast<const uint8_t*>(r.str), r.len);
  std::string why;
  const auto h = decode_tier_header(value, why);
  if (h) {
    why = codec_.decode(*h, ns, block_hash, value.subspan(kTierHeaderBytes), out);
    if (why.empty()) {
      reader_->count(&RedisStoreStats::hits);
      reader_->count(&RedisStoreStats::bytes_read, value.size());
      return true;
    }
  }
  reader_->count(&RedisStoreStats::corrupt);
  reader_->run({{"UNLINK", k}});
  return false;
}

bool RedisStore::erase(const Hash256& ns, const Hash256& block_hash) {
  const auto replies = writer_->run({{"UNLINK", key(ns, block_hash)}});
  return !replies.empty() && replies[0]->type == REDIS_REPLY_INTEGER && replies[0]->integer == 1;
}

size_t RedisStore::clear() {
  size_t removed = 0;
  std::string cursor = "0";
  do {
    const auto replies = writer_->run({{"SCAN", cursor, "MATCH", "kvcache:v1:*", "COUNT", "1000"}});
    if (replies.empty() || replies[0]->type != REDIS_REPLY_ARRAY || replies[0]->elements != 2) {
      break;
    }
    const redisReply& r = *replies[0];
    cursor.assign(r.element[0]->str, r.element[0]->len);
    std::vector<std::string_view> args = {"UNLINK"};
    for (size_t i = 0; i < r.element[1]->elements; ++i) {
      args.emplace_back(r.element[1]->element[i]->str, r.element[1]->element[i]->len);
    }
    if (args.size() > 1) {
      const auto done = writer_->run({args});
      if (!done.empty() && done[0]->type == REDIS_REPLY_INTEGER) {
        removed += static_cast<size_t>(done[0]->integer);
      }
    }
  } while (cursor != "0");
  return removed;
}

RedisStoreStats RedisStore::stats() const {
  const RedisStoreStats r = reader_->stats();
  const RedisStoreStats w = writer_->stats();
  RedisStoreStats s;
  s.hits = r.hits;
  s.misses = r.misses;
  s.corrupt = r.corrupt;
  s.writes = w.writes;
  s.errors = r.errors + w.errors;
  s.skipped = r.skipped + w.skipped;
  s.connects = r.connects + w.connects;
  s.bytes_written = w.bytes_written;
  s.bytes_read = r.bytes_read;
  s.up = r.up || w.up;
  return s;
}

}  // namespace kvc::kv
