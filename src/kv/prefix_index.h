// The prefix index: a radix tree over token ids at block granularity, per namespace, whose
// nodes own cached KV blocks. Requests that read the same prefix share its blocks; a block
// that matches only in part is reused by copying its matching tokens; memory is reclaimed
// only when an allocation finds no free block, from unreferenced leaves, least recently used
// first; and every lookup that stops early says why.
//
// Under a sliding window (KvGeometry::window_tokens) a prefix needs only the blocks its last
// window touches: any unreferenced block may be evicted, an inner one leaving a hollow node that
// keeps its tokens and hash so that the blocks after it stay reachable. A lookup walks through
// hollow nodes and reuses the longest prefix whose window's blocks are all present; the table it
// fills holds holes for the blocks before that window.
//
// Thread-safety: none; its owner (the KV cache manager) serialises every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "kv/content_hash.h"

namespace kvc::kv {

// Milliseconds on a monotonic clock; tests pass a manual one.
using Clock = std::function<double()>;
Clock steady_clock_ms();

enum class MissKind : uint8_t {
  kNone,          // everything up to the limit came from the cache
  kCold,          // this namespace never held the next tokens
  kDiverged,      // cached sequences continue differently from token at_token on
  kEvicted,       // the next block was cached but evicted at evicted_at_ms
  kPartialBlock,  // a cached block matched in part but could not be reused
  kQuota,         // the next block was dropped or refused by the namespace quota
  kDisabled,      // prefix caching is off
};

struct MissReason {
  MissKind kind = MissKind::kNone;
  size_t at_token = 0;       // the first prompt token that was not served from the cache
  double evicted_at_ms = 0;  // kEvicted and kQuota: when the block left (or was refused)
  // "none", "cold", "diverged@K", "evicted@T.Ts-ago", "partial_block", "quota", "disabled".
  std::string to_string(double now_ms) const;
  // The bare kind name ("diverged"), for metrics labels and JSON.
  std::string kind_name() const;
};

struct PrefixMatch {
  size_t cached_tokens = 0;  // tokens whose keys and values the table now holds
  size_t shared_blocks = 0;  // full blocks shared with the cache
  size_t copied_tokens = 0;  // tokens copied from a partly matching block
  // Of the shared blocks, those no sequence held at lookup time: the match takes them out of
  // the evictable set, so an admission check must not count them as room as well.
  size_t shared_unreferenced = 0;
  // The chained hash of the last shared block (zero when none): where a tier lookup of the
  // blocks after the shared ones chains on.
  Hash256 last_shared_hash{};
  MissReason miss;
};

// A full block insert() newly indexed: what a lower tier needs to store it.
struct IndexedBlock {
  Hash256 hash{};  // chained hash (namespace, parent, tokens)
  BlockId block = 0;
  size_t first_token = 0;  // position of its first token in the sequence
};

// A pin of a prefix's cached blocks until an expiry; pins compose: a block stays pinned while
// any live lease covers it, and releasing one lease leaves the others.
struct PinLease {
  uint64_t id = 0;    // 0: nothing was pinned
  size_t tokens = 0;  // tokens of the prefix whose blocks the lease covers
};

// A block that left the cache, as the ledger remembers it.
struct EvictedBlock {
  MissKind kind = MissKind::kEvicted;  // kEvicted, or kQuota when the namespace refused it
  double at_ms = 0;
  uint8_t tag = 0;  // the note its owner attached while it was cached
};

// What the index knows of a cached block, for a policy that values blocks.
struct BlockFacts {
  Hash256 hash{};           // its chained hash
  size_t depth_tokens = 0;  // tokens before the block
  uint32_t hits = 0;        // times a request reused it
  double age_ms = 0;        // since it was computed
  double idle_ms = 0;       // since it was last used
};

// A cached block the pool is about to reuse for something else, still holding its data.
struct LeavingBlock {
  Hash256 ns{};
  BlockId block = 0;
  BlockFacts facts;
  uint8_t tag = 0;  // its owner's note
};

struct PrefixIndexOptions {
  bool enabled = true;
  // The window the indexed blocks' layers slide over; -1: the pool's (a windowed group of a
  // split pool passes its own).
  int window_tokens = -1;
  // Another index holds blocks of the same pool (a split pool's other group): the pool-wide
  // accounting is then checked by their owner, not by check_invariants().
  bool shares_pool = false;
  // Copy the matching part of a partly matching cached block (never with keys grouped per
  // channel, whose partly filled blocks are not indexed).
  bool partial_reuse = true;
  size_t ledger_capacity = size_t{1} << 16;  // evicted-block hashes remembered for reasons
  // When set, eviction takes the block of least value among the value_sample least recently
  // used evictable ones (a sampled policy, as Redis approximates LRU), instead of the oldest.
  std::function<double(const BlockFacts&)> block_value{};
  size_t value_sample = 8;
  // When set, called for each block evicted to make room (not for flushes), while its data is
  // still in the pool; returns the note the ledger keeps for it.
  std::function<uint8_t(const LeavingBlock&)> on_evict{};
};

struct PrefixIndexStats {
  size_t nodes = 0;  // cached blocks held by the index (referenced or not)
  size_t namespaces = 0;
  uint64_t inserted_blocks = 0;
  uint64_t evicted_blocks = 0;
  uint64_t queried_tokens = 0;
  uint64_t hit_tokens = 0;
};

struct NamespaceStats {
  size_t blocks = 0;
  size_t pinned_blocks = 0;  // blocks under a live pin (referenced or not)
  size_t quota = 0;          // 0: unlimited
  uint64_t queried_tokens = 0;
  uint64_t hit_tokens = 0;
};

class PrefixIndex : public BlockSource {
 public:
  // An index over pool's blocks; pool must outlive the index.
  explicit PrefixIndex(BlockPool& pool, PrefixIndexOptions options = {},
                       Clock clock = steady_clock_ms());
  ~PrefixIndex();
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // Finds the longest cached prefix of tokens[0, limit) in namespace ns and appends it to the
  // empty table: whole blocks shared, then the matching part of one more block copied into a
  // fresh block taken from the table's source. Says why it stopped when it stopped before limit.
  // A request's lookup counts in the hit statistics and its blocks' hits; the cache's own
  // (counted false: taking a prefix to extend it from a lower tier) counts in neither.
  PrefixMatch match(const Hash256& ns, std::span<const int32_t> tokens, size_t limit,
                    BlockTable& table, bool counted = true);
  // What match() would return, without taking blocks, copying or touching recency.
  PrefixMatch explain(const Hash256& ns, std::span<const int32_t> tokens, size_t limit) const;

  // Indexes the blocks of table that hold tokens[0, n_tokens): every full block, and with
  // include_partial the last, partly filled one (pass it only when the sequence is done
  // writing). Indexed blocks become immutable and stay cached when their last reference goes.
  // Returns the full blocks this call indexed (not those already cached).
  std::vector<IndexedBlock> insert(const Hash256& ns, std::span<const int32_t> tokens,
                                   size_t n_tokens, const BlockTable& table, bool include_partial);

  // Pins the first (at most max_blocks) cached full blocks of the prefix tokens until
  // now + ttl_ms under a new lease (under a window, the blocks the window at the prefix's end
  // reads, at most max_blocks of them); eviction skips pinned blocks unless told otherwise.
  PinLease pin(const Hash256& ns, std::span<const int32_t> tokens, double ttl_ms,
               size_t max_blocks = SIZE_MAX);
  // Ends one lease (early); other leases on the same blocks stay. False if it is not live.
  bool unpin(uint64_t lease);
  // Forgets leases whose expiry has passed; returns how many.
  size_t expire_pins();
  // Live leases.
  size_t pin_count() const { return leases_.size(); }
  // Unreferenced blocks under a live pin (cached but not evictable without ignoring pins).
  size_t pinned_unreferenced_blocks() const;
  // Caps the blocks ns may keep cached (0: no cap).
  void set_quota(const Hash256& ns, size_t max_blocks);

  // Evicts up to n unreferenced leaf blocks (any unreferenced block under a window), least
  // recently used (or least valuable) first, skipping pinned ones unless ignore_pins (the last
  // resort when nothing else can make room).
  size_t evict(size_t n, bool ignore_pins = false);
  // When the next eviction's block was last used (ms), nullopt when none is evictable: where
  // two indexes share a pool, the one whose victim is older gives up a block.
  std::optional<double> victim_used_ms(bool ignore_pins) const;
  // Evicts every unreferenced block, pinned or not; returns how many.
  size_t flush();
  // A free block, evicting the least recently used unpinned block when none is free.
  std::optional<BlockId> take_block() override;

  // Calls fn for every indexed block, as if it were leaving, and keeps the note it returns.
  void visit_cached(const std::function<uint8_t(const LeavingBlock&)>& fn);
  // Attaches the owner's one-byte note to the cached block (ignored if it is not indexed);
  // the note outlives the block in the ledger of evicted blocks.
  void tag_block(BlockId block, uint8_t tag);
  // What the ledger remembers of the block with this chained hash: why and when it left the
  // cache and its note; nullopt if it is cached, never was, or has been forgotten.
  std::optional<EvictedBlock> evicted(const Hash256& hash) const;

  PrefixIndexStats stats() const;
  NamespaceStats namespace_stats(const Hash256& ns) const;
  // Approximate bytes of index bookkeeping (nodes, keys, maps), not of KV data.
  size_t index_bytes() const;
  double now_ms() const { return clock_(); }
  bool enabled() const { return options_.enabled; }
  // Throws Error if the tree, the LRU list, the pool states and the counters disagree.
  void check_invariants() const;

 private:
  struct Node;
  struct Space;
  struct Walk;
  struct HashKey {
    size_t operator()(const Hash256& h) const;
  };
  struct LedgerEntry {
    MissKind kind;
    double at_ms;
    uint64_t stamp;  // matches the ledger_order_ entry that may expire it
    uint8_t tag;
  };

  Walk walk(const Hash256& ns, std::span<const int32_t> tokens, size_t limit) const;
  Space& space(const Hash256& ns);
  void insert_blocks(const Hash256& ns, std::span<const int32_t> tokens, size_t n_tokens,
                     const BlockTable& table, bool include_partial,
                     std::vector<IndexedBlock>& added);
  const Space* find_space(const Hash256& ns) const;
  Node* add_child(Space& sp, Node& parent, std::vector<int32_t> key, BlockId block);
  // Evicts the namespace's oldest leaves until it is under its quota, never `keep` (the node
  // an insert is about to extend or refill), which stays in the tree even when hollow and left
  // without children (the caller prunes it if it then gives up); false when it cannot get there.
  bool make_room(Space& sp, const Node* keep);
  bool evictable(const Node& n, bool ignore_pins) const;
  Node* oldest_evictable(const Space* only, bool ignore_pins, const Node* keep = nullptr) const;
  BlockFacts facts_of(const Node& n, double now) const;
  // The eviction victim: the oldest evictable block, or the least valuable of a sample.
  Node* victim(bool ignore_pins) const;
  // Frees n's block: a leaf leaves the tree (with the hollow nodes it alone kept, up to but not
  // including keep), an inner node (only under a window) stays as a hollow one.
  void remove_block(Node* n, MissKind why, const Node* keep = nullptr);
  // Takes n out of the tree if it is hollow and has no children, and so each hollow ancestor it
  // alone kept, stopping at keep.
  void prune_hollow(Node* n, const Node* keep = nullptr);
  // Gives the node n, whose block is unreferenced, the same tokens' block b instead, freeing its
  // own.
  void adopt(Node* n, BlockId b);
  // Gives the hollow node n the block b again (a sequence recomputed it).
  void refill(Node* n, BlockId b);
  // Cuts a walk back to the longest prefix whose window's blocks are all present, saying why in
  // its miss; true when it cut.
  bool fit_window(Walk& w) const;
  // The most of the first `full` blocks of path a match may share with every block the window
  // of its next token reads present.
  size_t window_fit(const std::vector<Node*>& path, size_t full) const;
  // Blocks before the one holding the first key the token after `cached` tokens reads.
  size_t first_held(size_t cached) const;
  // Whether n is in the eviction order: every node holding a block under a window, else leaves.
  bool lru_member(const Node& n) const;
  void touch(Node* n);
  void lru_add(Node* n);
  void lru_remove(Node* n);
  void remember(const Hash256& hash, MissKind kind, uint8_t tag = 0);
  bool pinned(const Node& n) const;
  // Drops a namespace that holds no blocks and has no quota (its stats go with it).
  void drop_if_empty(const Space* sp);
  struct Lease {
    Hash256 ns{};
    std::vector<int32_t> tokens;  // the pinned prefix
    double until = 0;
  };

  BlockPool& pool_;
  PrefixIndexOptions options_;
  KvGeometry geometry_;  // the pool's, with this index's window
  size_t window_ = 0;    // the sliding window in tokens (0: none)
  Clock clock_;
  uint64_t tick_ = 0;
  std::map<Hash256, std::unique_ptr<Space>> spaces_;
  std::set<std::pair<uint64_t, Node*>> lru_;  // lru_member nodes, by last access
  std::vector<Node*> node_of_block_;
  std::unordered_map<Hash256, LedgerEntry, HashKey> ledger_;
  std::deque<std::pair<Hash256, uint64_t>> ledger_order_;
  uint64_t ledger_stamp_ = 0;
  std::map<uint64_t, Lease> leases_;
  uint64_t next_lease_ = 1;
  PrefixIndexStats stats_;
};

}  // namespace kvc::kv
