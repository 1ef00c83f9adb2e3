// The Redis tier's store: KV blocks shared by every kvcache instance pointed at one Redis.
//
// Key layout: "kvcache:v1:" + the namespace hash (64 hex digits) + ":" + the block's chained
// hash (64 hex digits). Both are SHA-256 digests, so a key reveals neither a prompt nor a
// tenant. The value is a TierBlockHeader followed by the payload, as on disk, and is checked
// the same way when read (model, namespace, block hash, geometry, dtypes, checksum). Values
// expire after ttl_seconds (SET ... EX); under Redis `maxmemory` eviction a block may vanish at
// any time, which reads see as a miss.
//
// Redis down, slow or restarted: every command has a timeout, and so has connecting, the
// host name's lookup included (kv/host_resolver.h); after a failure the connection
// is dropped and not retried before a backoff (doubling up to a maximum), during which
// operations fail at once and are counted. The caller then recomputes: nothing here waits
// longer than one timeout.
//
// Thread-safety: every function may be called from any thread. Reads and writes use separate
// connections, so the step loop's reads never wait behind the writer's uploads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/mutex.h"
#include "kv/content_hash.h"
#include "kv/tier_block.h"
#include "kv/tier_codec.h"

namespace kvc::kv {

struct RedisAddress {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string password;  // empty: no AUTH
  int db = 0;
};

// Parses redis://[:PASSWORD@]HOST[:PORT][/DB]; throws Error naming what is wrong.
RedisAddress parse_redis_url(std::string_view url);

struct RedisStoreOptions {
  RedisAddress address;
  double timeout_ms = 100;  // name lookup and connect together, and each command
  std::string dns_servers;  // "IP[:PORT],..." asked for the host's name; empty: the system's
  double ttl_seconds = 24 * 3600.0;
  double backoff_initial_ms = 250;
  double backoff_max_ms = 10000;
};

struct RedisStoreStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t corrupt = 0;  // values refused by the checks
  uint64_t writes = 0;
  uint64_t errors = 0;   // failed connects and commands (timeouts, refused, server errors)
  uint64_t skipped = 0;  // operations not tried while backing off
  uint64_t connects = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  bool up = false;  // the last command on the read connection succeeded
};

class RedisStore {
 public:
  // Connects lazily: a Redis that is down now is not an error here.
  // codec packs and checks blocks (identity, compression, encryption).
  RedisStore(TierCodec codec, RedisStoreOptions options);
  ~RedisStore();
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  // Stores a block (SET with the TTL); false when Redis failed or is backing off.
  bool put(const Hash256& ns, const Hash256& block_hash, uint32_t token_count,
           std::span<const uint8_t> payload);
  // How many of hashes, from the first, Redis holds (one pipelined round trip).
  size_t present_prefix(const Hash256& ns, std::span<const Hash256> hashes);
  // Reads a block into out (exactly the payload size); false when absent, refused by the
  // checks, or Redis failed.
  bool get(const Hash256& ns, const Hash256& block_hash, std::span<uint8_t> out);
  // Deletes every kvcache block key in the database (SCAN + UNLINK); returns how many.
  size_t clear();
  // Deletes one block; false when it was not there or Redis could not be reached.
  bool erase(const Hash256& ns, const Hash256& block_hash);

  RedisStoreStats stats() const;
  static std::string key(const Hash256& ns, const Hash256& block_hash);

 private:
  class Connection;
  const TierCodec codec_;
  const RedisStoreOptions options_;
  std::unique_ptr<Connection> reader_, writer_;
};

}  // namespace kvc::kv
