// The KV cache manager: the cache's policy over the pool and the prefix index. It finds a
// request's computed (cached) blocks, allocates with inline eviction (unpinned blocks, least
// recently used first; then pinned and session-held ones, before any running request is
// preempted), seals filled blocks into the index, and owns pins and sessions with their caps.
// With lower tiers (disk, Redis), a full block it seals is also stored there behind the step
// loop when the cost model expects it to be read back (all of them under keep-all), a block
// dropped then but reused in the pool is stored when the pool evicts it, and a request's
// lookup loads the blocks that follow its in-pool prefix from the tiers, disk first, as far as
// they hold an unbroken chain (a warm restart, or another instance on the same Redis, finds
// them again).
//
// Thread-safety: none. The engine calls it from its step thread and from cache operations, all
// under the engine's state mutex.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/histogram.h"
#include "engine/cost_model.h"
#include "engine/sequence.h"
#include "kv/block_pool.h"
#include "kv/block_source.h"
#include "kv/disk_store.h"
#include "kv/prefix_index.h"
#include "kv/redis_store.h"
#include "kv/tier_write_queue.h"

namespace kvc::engine {

// The lower tiers behind the pool.
struct TierOptions {
  // The disk tier: a directory and a byte budget (empty directory: no disk tier).
  std::string disk_dir;
  uint64_t disk_max_bytes = uint64_t{10} << 30;
  kv::TierCompression disk_compression = kv::TierCompression::kNone;
  // The Redis tier (empty URL: none).
  std::string redis_url;
  std::string redis_password;  // overrides the URL's password (from a file)
  double redis_timeout_ms = 100;
  double redis_ttl_seconds = 24 * 3600.0;
  kv::TierCompression redis_compression = kv::TierCompression::kNone;
  // Encrypts (and requires encrypted) blocks in both tiers.
  std::optional<kv::TierKey> key;
  TierPolicy policy = TierPolicy::kCostModel;
};

struct KvCacheOptions {
  bool prefix_cache = true;
  bool partial_reuse = true;
  double session_ttl_ms = 10 * 60 * 1000.0;
  size_t session_max_blocks = 256;  // blocks one session keeps pinned between turns
  // Blocks one namespace (tenant) may hold pinned through sessions and pins; 0: a quarter of
  // the pool.
  size_t tenant_pinned_max_blocks = 0;
  TierOptions tiers;
  // Identity of stored blocks: the model (weights and tokenizer) they were computed by.
  kv::Hash256 model_fingerprint{};
};

struct TierCounts {
  bool disk = false;  // a disk tier is configured
  kv::DiskStoreStats disk_store;
  kv::TierWriteStats disk_writes;
  bool redis = false;  // a Redis tier is configured
  kv::RedisStoreStats redis_store;
  kv::TierWriteStats redis_writes;
  uint64_t disk_loaded_blocks = 0;  // blocks loaded into the pool from each tier
  uint64_t redis_loaded_blocks = 0;
  TierPolicy policy = TierPolicy::kCostModel;
  CostModelSnapshot cost;
  std::array<Histogram::Snapshot, kTierCount> load_ms;  // per tier, of each block loaded
  size_t block_tokens = 0;
  // decisions[tier][decision], counted by the cost model.
  std::array<std::array<uint64_t, kTierDecisionCount>, kTierCount> decisions{};
};

struct KvCacheCounts {
  size_t total = 0;
  size_t free = 0;
  size_t referenced = 0;  // held by running sequences
  size_t cached = 0;      // unreferenced and evictable
  size_t pinned = 0;      // unreferenced but pinned (by a session or an admin pin)
};

class KvCacheManager : public kv::BlockSource {
 public:
  // Carves memory_bytes into blocks of geometry; throws Error if not even one fits.
  KvCacheManager(const kv::KvGeometry& geometry, uint64_t memory_bytes,
                 const KvCacheOptions& options, kv::Clock clock = kv::steady_clock_ms());
  // Writes back the reused blocks a tier dropped (see store_reused), then finishes the writes.
  ~KvCacheManager() override;

  // The cached prefix of s (all but its last token): one tree walk, remembered until the
  // index changes or a block goes between cached and referenced.
  const kv::PrefixMatch& computed(Sequence& s);
  // Blocks s must take from the pool to hold `tokens` tokens, computed at most chunk tokens a
  // step (it matters under a sliding window), given its cached prefix.
  size_t blocks_to_admit(Sequence& s, size_t tokens, size_t chunk);
  // Blocks that could be freed for s: free, plus every unreferenced cached or pinned block,
  // minus those s would itself share (they stop being evictable once it shares them).
  size_t room_for(Sequence& s);
  // Gives s a block table holding its cached prefix; sets s.written.
  kv::PrefixMatch attach(Sequence& s);
  // Makes s's table hold `tokens` tokens and the block at s.written private, evicting inline,
  // after releasing the blocks behind the window of s.written (a sliding-window model); false
  // (nothing allocated) when even pinned blocks cannot make room, or when growing would leave
  // fewer than keep_room blocks free or evictable (room promised to others).
  bool grow(Sequence& s, size_t tokens, size_t keep_room = 0);
  // Blocks free or evictable now (cached or pinned, held by no sequence).
  size_t room() const;
  // Indexes s's filled blocks; with final, its last partial block too (s is done writing).
  void seal(Sequence& s, bool final);
  // Drops s's table: indexed blocks stay cached, the rest go back to the free list.
  void detach(Sequence& s);
  // A free block: the free list, then the least recently used unpinned block, then the
  // oldest pinned one (a pin is a preference, never a reason to preempt a running request).
  std::optional<kv::BlockId> take_block() override;

  // Keeps the first tokens of s pinned for its session (at most session_max_blocks and the
  // tenant's remaining pinned allowance), replacing the session's previous pin.
  void keep_session(const std::string& session_id, const Sequence& s);
  bool close_session(const std::string& session_id);
  size_t session_count() const { return sessions_.size(); }
  // An admin pin of a prefix, within the tenant's pinned allowance.
  kv::PinLease pin(const kv::Hash256& ns, std::span<const int32_t> tokens, double ttl_ms);
  // Ends expired sessions and pins.
  void expire();

  kv::PrefixMatch explain(const kv::Hash256& ns, std::span<const int32_t> tokens) const;
  size_t flush();
  KvCacheCounts counts() const;
  kv::PrefixIndexStats index_stats() const;
  TierCounts tier_counts() const;
  // Deletes every block of the lower tiers; returns how many.
  size_t flush_tiers();
  // Waits until every block offered to the lower tiers has been written (tests, shutdown).
  void drain_tiers();
  // True when a disk or Redis tier is configured.
  bool has_tiers() const { return disk_ || redis_; }
  // The tiers' cost model (the engine feeds it the time of its forward passes).
  CostModel& cost_model() { return cost_; }
  const CostModel& cost_model() const { return cost_; }
  kv::NamespaceStats namespace_stats(const kv::Hash256& ns) const;
  const kv::BlockPool& pool() const { return *pool_; }
  kv::BlockPool& pool() { return *pool_; }
  size_t tenant_pinned_max_blocks() const { return tenant_cap_; }
  const KvCacheOptions& options() const { return options_; }
  double now_ms() const { return index_->now_ms(); }

 private:
  struct Session {
    kv::Hash256 ns{};
    uint64_t lease = 0;
    uint64_t window_lease = 0;  // the windowed layers' blocks, where the pool splits them
    double expires_at_ms = 0;
  };
  uint64_t version() const;
  // Loads the blocks of s's prompt that follow its in-pool prefix from the lower tiers into the
  // pool and the index, as far as they are stored there in an unbroken chain.
  void load_from_tiers(Sequence& s);
  // The value of keeping a cached block in the pool (the cost model's eviction order).
  double block_value(const kv::BlockFacts& f) const;
  // Whether the seal of a block at depth_tokens should store it in tier; counts why and records
  // it in tag (the block's note in the index).
  bool store_in(Tier tier, size_t depth_tokens, uint8_t& tag);
  // A block leaving the pool (evicted, or at shutdown): stores it in the tiers that dropped it
  // when it was computed if it has been reused since (and its reads repay a write); returns its
  // updated tag. With wait_for_room, a full write queue is drained rather than the block lost.
  uint8_t store_reused(const kv::LeavingBlock& b, bool wait_for_room);
  // Copies pool block `block` into tier's write queue (waiting for room, or dropped when full).
  void offer_write(Tier tier, const kv::Hash256& ns, const kv::Hash256& hash, kv::BlockId block,
                   bool wait_for_room = false);
  // Passes the writers' measured processor time per block to the cost model.
  void measure_writes();
  // Counts the blocks of s's prompt wanted again (the in-pool prefix, first_token tokens long,
  // then those that left the pool; wanted: the chained hashes after that prefix, in_tiers of
  // them held by a tier) and, when the chain stops at a block no tier kept, says why in s's
  // tier note.
  void note_returns(Sequence& s, std::span<const kv::Hash256> wanted, size_t in_tiers,
                    size_t first_token);
  // Ends a session's leases.
  void unpin(const Session& session);
  // Pinned blocks ns may still add.
  size_t tenant_allowance(const kv::Hash256& ns) const;
  // The indexes: the full layers', then the windowed layers' where the pool splits them.
  std::vector<kv::PrefixIndex*> indexes() const;
  // Combines the full layers' lookup with the windowed layers' (made up to its cached tokens).
  kv::PrefixMatch combine(const kv::PrefixMatch& full, const kv::PrefixMatch& window) const;

  KvCacheOptions options_;
  std::unique_ptr<kv::BlockPool> pool_;
  std::unique_ptr<kv::PrefixIndex> index_;
  // Where the pool splits windowed layers from full ones: their index, of the same pool.
  std::unique_ptr<kv::PrefixIndex> window_index_;
  size_t tenant_cap_ = 0;
  std::map<std::string, Session> sessions_;
  // The writer is declared after the store, so it stops (finishing its writes) first.
  std::unique_ptr<kv::DiskStore> disk_;
  std::unique_ptr<kv::TierWriteQueue> disk_writer_;
  std::unique_ptr<kv::RedisStore> redis_;
  std::unique_ptr<kv::TierWriteQueue> redis_writer_;
  uint64_t disk_loaded_blocks_ = 0;
  uint64_t redis_loaded_blocks_ = 0;
  CostModel cost_;
  std::array<Histogram, kTierCount> load_ms_{Histogram(Histogram::fast_latency_ms_bounds()),
                                             Histogram(Histogram::fast_latency_ms_bounds())};
};

}  // namespace kvc::engine
