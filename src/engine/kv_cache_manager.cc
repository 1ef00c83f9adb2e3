#include "engine/kv_cache_manager.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "base/error.h"

namespace kvc::engine {

KvCacheManager::KvCacheManager(const kv::KvGeometry& geometry, uint64_t memory_bytes,
                               const KvCacheOptions& options, kv::Clock clock)
    : options_(options),
      // Until a load is measured: a local file read at about 1 GB/s, a network round trip and
      // about 200 MB/s for Redis.
      cost_(static_cast<size_t>(geometry.block_tokens),
            {0.05 + static_cast<double>(geometry.bytes_per_block()) / 1e6,
             0.3 + static_cast<double>(geometry.bytes_per_block()) / 2e5}) {
  pool_ = std::make_unique<kv::BlockPool>(geometry, memory_bytes);
  const TierOptions& t = options_.tiers;
  const bool tiered = options_.prefix_cache && (!t.disk_dir.empty() || !t.redis_url.empty());
  if (tiered && geometry.slides()) {
    fail(
        "the disk and Redis tiers do not store the blocks of a sliding-window model (a window of "
        "{} tokens): a stored prefix would need its window's blocks back as well; run without "
        "--kv-disk and --kv-redis",
        std::max(geometry.window_tokens, geometry.split_window));
  }
  kv::PrefixIndexOptions io;
  io.enabled = options_.prefix_cache;
  io.partial_reuse = options_.partial_reuse;
  if (tiered && t.policy == TierPolicy::kCostModel) {
    io.block_value = [this](const kv::BlockFacts& f) { return block_value(f); };
    io.on_evict = [this](const kv::LeavingBlock& b) { return store_reused(b, false); };
  }
  if (geometry.split_window > 0) {
    // Two groups of layers in one pool: each has its own index, and this manager checks and
    // evicts across both.
    io.shares_pool = true;
    kv::PrefixIndexOptions window = io;
    window.window_tokens = geometry.split_window;
    window_index_ = std::make_unique<kv::PrefixIndex>(*pool_, window, clock);
  }
  index_ = std::make_unique<kv::PrefixIndex>(*pool_, io, std::move(clock));
  tenant_cap_ = options_.tenant_pinned_max_blocks > 0
                    ? options_.tenant_pinned_max_blocks
                    : std::max<size_t>(1, pool_->num_blocks() / 4);
  kv::TierIdentity id;
  id.model_fingerprint = options_.model_fingerprint;
  id.geometry = geometry;
  // Up to 256 blocks (or 64 MiB) wait for a tier; beyond that, blocks are not stored there.
  const uint64_t queue_bytes =
      std::max<uint64_t>(geometry.bytes_per_block(),
                         std::min<uint64_t>(uint64_t{64} << 20, 256 * geometry.bytes_per_block()));
  if (!t.redis_url.empty() && options_.prefix_cache) {
    kv::RedisStoreOptions ro;
    ro.address = kv::parse_redis_url(t.redis_url);
    if (!t.redis_password.empty()) ro.address.password = t.redis_password;
    ro.timeout_ms = t.redis_timeout_ms;
    ro.ttl_seconds = t.redis_ttl_seconds;
    redis_ = std::make_unique<kv::RedisStore>(kv::TierCodec(id, t.redis_compression, t.key), ro);
    redis_writer_ = std::make_unique<kv::TierWriteQueue>(
        [store = redis_.get()](const kv::TierWrite& w) {
          return store->put(w.ns, w.hash, w.tokens, w.payload);
        },
        queue_bytes);
  }
  if (!t.disk_dir.empty() && options_.prefix_cache) {
    disk_ = std::make_unique<kv::DiskStore>(
        t.disk_dir, kv::TierCodec(id, t.disk_compression, t.key), t.disk_max_bytes);
    disk_writer_ = std::make_unique<kv::TierWriteQueue>(
        [store = disk_.get()](const kv::TierWrite& w) {
          return store->put(w.ns, w.hash, w.tokens, w.payload);
        },
        queue_bytes);
  }
}

double KvCacheManager::block_value(const kv::BlockFacts& f) const {
  double next_best = cost_.recompute_ms(f.depth_tokens);
  if (disk_ && disk_->contains(f.hash)) next_best = std::min(next_best, cost_.load_ms(Tier::kDisk));
  return cost_.pool_value(f, next_best);
}

namespace {

// A block's tag in the index records the store decision of each tier (0: none), so that a
// later miss on it can say why no tier held it.
uint8_t with_decision(uint8_t tag, Tier tier, TierDecision d) {
  const int shift = tier == Tier::kDisk ? 0 : 4;
  return static_cast<uint8_t>((tag & ~(0xF << shift)) | ((static_cast<int>(d) + 1) << shift));
}

std::optional<TierDecision> decision_in(uint8_t tag, Tier tier) {
  const int v = (tag >> (tier == Tier::kDisk ? 0 : 4)) & 0xF;
  if (v == 0) return std::nullopt;
  return static_cast<TierDecision>(v - 1);
}

}  // namespace

bool KvCacheManager::store_in(Tier tier, size_t depth_tokens, uint8_t& tag) {
  const TierDecision d = options_.tiers.policy == TierPolicy::kKeepAll
                             ? TierDecision::kStored
                             : cost_.store_decision(tier, depth_tokens);
  cost_.count(tier, d);
  tag = with_decision(tag, tier, d);
  return d == TierDecision::kStored;
}

void KvCacheManager::measure_writes() {
  const auto mean = [](const kv::TierWriteStats& w) {
    const uint64_t n = w.written + w.failed;
    return n == 0 ? -1.0 : w.write_cpu_ms / static_cast<double>(n);
  };
  if (disk_writer_) cost_.observe_write(Tier::kDisk, mean(disk_writer_->stats()));
  if (redis_writer_) cost_.observe_write(Tier::kRedis, mean(redis_writer_->stats()));
}

uint64_t KvCacheManager::version() const {
  // Every change of the tree inserts or evicts a block, and a lookup's count of the cached
  // blocks it would reference changes as blocks go between cached and referenced (a holder of
  // the prefix finishing or preempted); 1 + so that 0 means "never looked".
  uint64_t changes = 1 + pool_->cached_transitions();
  for (const kv::PrefixIndex* index : indexes()) {
    const kv::PrefixIndexStats s = index->stats();
    changes += s.inserted_blocks + s.evicted_blocks;
  }
  return changes;
}

const kv::PrefixMatch& KvCacheManager::computed(Sequence& s) {
  const uint64_t v = version();
  if (s.lookup_version != v) {
    s.lookup = explain(s.req.ns, s.tokens);
    s.lookup_version = v;
  }
  return s.lookup;
}

size_t KvCacheManager::blocks_to_admit(Sequence& s, size_t tokens, size_t chunk) {
  const size_t need = pool_->geometry().blocks_for_sequence(tokens, chunk);
  return need - std::min(need, computed(s).shared_blocks);
}

size_t KvCacheManager::room_for(Sequence& s) {
  const size_t shared = computed(s).shared_unreferenced;
  return room() - std::min(pool_->counts().cached, shared);
}

kv::PrefixMatch KvCacheManager::attach(Sequence& s) {
  // The lower tiers are read only for a sequence being admitted, just before it shares what
  // they gave: looking a waiting one up costs no reads, and its loaded blocks cannot be evicted
  // again before it runs.
  load_from_tiers(s);
  s.table = std::make_unique<kv::BlockTable>(*pool_, this);
  kv::PrefixMatch m = index_->match(s.req.ns, s.tokens, s.tokens.size() - 1, *s.table);
  if (window_index_) {
    // The windowed layers' blocks, up to where the full layers' reach; the full layers keep no
    // more than they do.
    s.window_table = std::make_unique<kv::BlockTable>(*pool_, this);
    const kv::PrefixMatch w =
        window_index_->match(s.req.ns, s.tokens, m.cached_tokens, *s.window_table);
    s.table->truncate(w.cached_tokens);
    m = combine(m, w);
  }
  s.written = m.cached_tokens;
  s.lookup_version = 0;
  return m;
}

size_t KvCacheManager::room() const {
  const kv::PoolCounts c = pool_->counts();
  return c.free + c.cached;
}

bool KvCacheManager::grow(Sequence& s, size_t tokens, size_t keep_room) {
  // Under a sliding window the blocks behind the next token's window go first (sealed ones stay
  // cached for other requests), so that a sequence holds no more than its window.
  const kv::KvGeometry& g = pool_->geometry();
  s.table->release_before(g.group(0).first_needed(s.written));
  if (s.window_table) s.window_table->release_before(g.group(1).first_needed(s.written));
  const size_t held = s.table->capacity_tokens();
  const size_t window_held = s.window_table ? s.window_table->capacity_tokens() : 0;
  const bool grown = s.table->reserve(tokens) && s.table->ensure_writable(s.written) &&
                     (!s.window_table || (s.window_table->reserve(tokens) &&
                                          s.window_table->ensure_writable(s.written))) &&
                     room() >= keep_room;
  if (!grown) {
    // Nothing taken stays taken: the blocks reserved before the step that failed go back, so
    // that the victims chosen next are chosen for what s really holds.
    s.table->truncate(std::max(held, s.written));
    if (s.window_table) s.window_table->truncate(std::max(window_held, s.written));
  }
  return grown;
}

void KvCacheManager::seal(Sequence& s, bool final) {
  if (!s.table) return;
  const std::vector<kv::IndexedBlock> added =
      index_->insert(s.req.ns, s.tokens, s.written, *s.table, final);
  if (s.window_table) window_index_->insert(s.req.ns, s.tokens, s.written, *s.window_table, final);
  if (!disk_writer_ && !redis_writer_) return;
  cost_.observe_computed(added.size());
  if (!added.empty()) measure_writes();
  for (const kv::IndexedBlock& b : added) {
    uint8_t tag = 0;
    if (disk_writer_ && !disk_->contains(b.hash) && !disk_writer_->holds(b.hash) &&
        store_in(Tier::kDisk, b.first_token, tag)) {
      offer_write(Tier::kDisk, s.req.ns, b.hash, b.block);
    }
    if (redis_writer_ && store_in(Tier::kRedis, b.first_token, tag)) {
      offer_write(Tier::kRedis, s.req.ns, b.hash, b.block);
    }
    index_->tag_block(b.block, tag);
  }
}

void KvCacheManager::offer_write(Tier tier, const kv::Hash256& ns, const kv::Hash256& hash,
                                 kv::BlockId block, bool wait_for_room) {
  const uint8_t* data = pool_->data(block);
  kv::TierWrite w{ns, hash, static_cast<uint32_t>(pool_->geometry().block_tokens),
                  std::vector<uint8_t>(data, data + pool_->geometry().bytes_per_block())};
  kv::TierWriteQueue& queue = tier == Tier::kDisk ? *disk_writer_ : *redis_writer_;
  if (queue.offer(w) || !wait_for_room) return;
  queue.drain();
  queue.offer(std::move(w));
}

uint8_t KvCacheManager::store_reused(const kv::LeavingBlock& b, bool wait_for_room) {
  if (b.facts.hits == 0) return b.tag;
  uint8_t tag = b.tag;
  for (const Tier tier : {Tier::kDisk, Tier::kRedis}) {
    const bool writer = tier == Tier::kDisk ? disk_writer_ != nullptr : redis_writer_ != nullptr;
    if (!writer || decision_in(tag, tier) != TierDecision::kDroppedSeldomReused) continue;
    if (tier == Tier::kDisk && (disk_->contains(b.facts.hash) || disk_writer_->holds(b.facts.hash)))
      continue;
    if (!cost_.store_when_evicted(tier, b.facts.depth_tokens)) continue;
    cost_.count(tier, TierDecision::kStoredWhenEvicted);
    tag = with_decision(tag, tier, TierDecision::kStoredWhenEvicted);
    offer_write(tier, b.ns, b.facts.hash, b.block, wait_for_room);
  }
  return tag;
}

KvCacheManager::~KvCacheManager() {
  // Blocks the pool still holds that were dropped when computed but have been reused since
  // are written as if evicted, so that a restart finds them (the writers finish before they
  // are destroyed).
  if (index_ && (disk_writer_ || redis_writer_) &&
      options_.tiers.policy == TierPolicy::kCostModel) {
    index_->visit_cached([this](const kv::LeavingBlock& b) { return store_reused(b, true); });
  }
}

void KvCacheManager::note_returns(Sequence& s, std::span<const kv::Hash256> wanted, size_t in_tiers,
                                  size_t first_token) {
  // Blocks wanted again: the prefix found in the pool, then, after it, those a tier holds and
  // those the ledger remembers as evicted (what a tier would have served had it stored them).
  size_t returned = in_tiers;
  while (returned < wanted.size() && index_->evicted(wanted[returned])) ++returned;
  cost_.observe_reuse(first_token / pool_->geometry().block_tokens + returned);
  if (returned == in_tiers || !s.stats.tier_note.empty()) return;
  // The chain stops at a block no tier held: say why it was not kept.
  const auto gone = index_->evicted(wanted[in_tiers]);
  const size_t bt = pool_->geometry().block_tokens;
  const size_t depth = first_token + in_tiers * bt;
  std::string why;
  for (const Tier tier : {Tier::kDisk, Tier::kRedis}) {
    if ((tier == Tier::kDisk && !disk_) || (tier == Tier::kRedis && !redis_)) continue;
    const auto d = decision_in(gone->tag, tier);
    std::string reason = "its write was lost or it was evicted from the tier";
    if (!d) {
      reason = "it was computed before this tier was in use";
    } else if (*d == TierDecision::kDroppedCheap) {
      reason = fmt::format("recomputing it ({:.3f} ms) is faster than loading it ({:.3f} ms)",
                           cost_.recompute_ms(depth), cost_.load_ms(tier));
    } else if (*d == TierDecision::kDroppedSeldomReused) {
      reason = fmt::format(
          "blocks were seldom wanted again after eviction ({:.2f} reads per block; a write "
          "costs {:.3f} ms, a read saves {:.3f} ms)",
          cost_.tier_reads_per_block(), cost_.write_ms(tier),
          cost_.recompute_ms(depth) - cost_.load_ms(tier));
    }
    why += fmt::format("{}not kept in the {} tier: {}", why.empty() ? "" : "; ", tier_name(tier),
                       reason);
  }
  s.stats.tier_note =
      fmt::format("the block at token {} left the pool and was recomputed; {}", depth, why);
}

void KvCacheManager::load_from_tiers(Sequence& s) {
  if ((!disk_ && !redis_) || s.tokens.size() < 2) return;
  const size_t bt = pool_->geometry().block_tokens;
  const size_t limit = s.tokens.size() - 1;  // the last prompt token is always computed
  const kv::PrefixMatch in_pool = index_->explain(s.req.ns, s.tokens, limit);
  const size_t first = in_pool.shared_blocks;
  // The chained hashes of the prompt's full blocks after the in-pool prefix, chained on from
  // the last block it shares (whose hash the index keeps).
  kv::Hash256 parent = in_pool.last_shared_hash;
  std::vector<kv::Hash256> wanted;
  const std::span<const int32_t> tokens(s.tokens);
  for (size_t b = first; (b + 1) * bt <= limit; ++b) {
    parent = kv::chain_hash(s.req.ns, parent, tokens.subspan(b * bt, bt));
    wanted.push_back(parent);
  }
  // Where each comes from: the disk's unbroken run first, then Redis's for the rest; a block
  // still waiting in a tier's write queue counts as held there.
  size_t on_disk = 0;
  while (disk_ && on_disk < wanted.size() &&
         (disk_->contains(wanted[on_disk]) || disk_writer_->holds(wanted[on_disk]))) {
    ++on_disk;
  }
  size_t in_redis = 0;
  while (redis_ && on_disk + in_redis < wanted.size()) {
    const size_t at = on_disk + in_redis;
    if (redis_writer_->holds(wanted[at])) {
      ++in_redis;
      continue;
    }
    const size_t present = redis_->present_prefix(s.req.ns, std::span(wanted).subspan(at));
    if (present == 0) break;
    in_redis += present;
  }
  note_returns(s, wanted, on_disk + in_redis, first * bt);
  if (on_disk + in_redis == 0) return;
  // Load a tier's run only when that is faster than recomputing it; a run not loaded ends
  // the chain there.
  const auto faster_to_load = [&](Tier tier, size_t from, size_t n) {
    if (n == 0 || options_.tiers.policy == TierPolicy::kKeepAll) return true;
    double recompute = 0;
    for (size_t i = from; i < from + n; ++i) recompute += cost_.recompute_ms(i * bt);
    const double load = static_cast<double>(n) * cost_.load_ms(tier);
    if (load < recompute) return true;
    s.stats.tier_note = fmt::format(
        "recomputed {} blocks held by the {} tier: {:.3f} ms to recompute, {:.3f} ms to load", n,
        tier_name(tier), recompute, load);
    return false;
  };
  if (!faster_to_load(Tier::kDisk, first, on_disk)) {
    for (size_t i = 0; i < on_disk; ++i) cost_.count(Tier::kDisk, TierDecision::kRecomputedFaster);
    return;
  }
  if (!faster_to_load(Tier::kRedis, first + on_disk, in_redis)) {
    for (size_t i = 0; i < in_redis; ++i) {
      cost_.count(Tier::kRedis, TierDecision::kRecomputedFaster);
    }
    in_redis = 0;
    if (on_disk == 0) return;
  }
  // A table sharing the in-pool prefix, extended by blocks read from the tiers, then indexed:
  // the loaded blocks become ordinary cached blocks.
  kv::BlockTable table(*pool_, this);
  index_->match(s.req.ns, s.tokens, first * bt, table, false);  // attach() counts the request
  if (table.blocks().size() != first) return;  // the prefix changed under us: skip the tiers
  const size_t bytes = pool_->geometry().bytes_per_block();
  size_t loaded = 0, from_disk = 0, from_redis = 0;
  for (; loaded < on_disk + in_redis; ++loaded) {
    if (!table.reserve((first + loaded + 1) * bt)) break;
    const kv::BlockId id = table.blocks()[first + loaded];
    const std::span<uint8_t> out(pool_->data(id), bytes);
    const kv::Hash256& hash = wanted[loaded];
    const Tier tier = loaded < on_disk ? Tier::kDisk : Tier::kRedis;
    const auto start = std::chrono::steady_clock::now();
    const kv::TierWriteQueue& queue = tier == Tier::kDisk ? *disk_writer_ : *redis_writer_;
    const bool queued = queue.read(s.req.ns, hash, out);
    const bool ok = queued || (tier == Tier::kDisk ? disk_->get(s.req.ns, hash, out)
                                                   : redis_->get(s.req.ns, hash, out));
    if (!ok) break;
    if (!queued) {  // a copy from the queue says nothing of the tier's speed
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      cost_.observe_load(tier, ms);
      load_ms_[static_cast<size_t>(tier)].observe(ms);
    }
    cost_.count(tier, TierDecision::kLoaded);
    if (tier == Tier::kDisk) {
      ++from_disk;
    } else {
      ++from_redis;
      // Kept on the local disk too, so the next hit does not cross the network.
      if (disk_writer_) offer_write(Tier::kDisk, s.req.ns, hash, id);
    }
  }
  if (loaded > 0) {
    index_->insert(s.req.ns, s.tokens, (first + loaded) * bt, table, false);
    // A loaded block is held by the tier it came from (and by the disk, once copied there).
    for (size_t i = 0; i < loaded; ++i) {
      uint8_t tag =
          with_decision(0, i < on_disk ? Tier::kDisk : Tier::kRedis, TierDecision::kLoaded);
      if (i >= on_disk && disk_writer_)
        tag = with_decision(tag, Tier::kDisk, TierDecision::kLoaded);
      index_->tag_block(table.blocks()[first + i], tag);
    }
    disk_loaded_blocks_ += from_disk;
    redis_loaded_blocks_ += from_redis;
    s.stats.disk_tokens += from_disk * bt;
    s.stats.redis_tokens += from_redis * bt;
  }
  table.clear();
}

TierCounts KvCacheManager::tier_counts() const {
  TierCounts t;
  t.disk = disk_ != nullptr;
  if (disk_) t.disk_store = disk_->stats();
  if (disk_writer_) t.disk_writes = disk_writer_->stats();
  t.redis = redis_ != nullptr;
  if (redis_) t.redis_store = redis_->stats();
  if (redis_writer_) t.redis_writes = redis_writer_->stats();
  t.disk_loaded_blocks = disk_loaded_blocks_;
  t.redis_loaded_blocks = redis_loaded_blocks_;
  t.policy = options_.tiers.policy;
  t.cost = cost_.snapshot();
  t.block_tokens = cost_.block_tokens();
  for (size_t i = 0; i < kTierCount; ++i) t.load_ms[i] = load_ms_[i].snapshot();
  for (size_t i = 0; i < kTierCount; ++i) {
    for (size_t d = 0; d < kTierDecisionCount; ++d) {
      t.decisions[i][d] = cost_.decisions(static_cast<Tier>(i), static_cast<TierDecision>(d));
    }
  }
  return t;
}

size_t KvCacheManager::flush_tiers() {
  drain_tiers();
  size_t n = 0;
  if (disk_) n += disk_->clear();
  if (redis_) n += redis_->clear();
  return n;
}

void KvCacheManager::drain_tiers() {
  if (disk_writer_) disk_writer_->drain();
  if (redis_writer_) redis_writer_->drain();
}

void KvCacheManager::detach(Sequence& s) {
  if (!s.table) return;
  s.table->clear();
  s.table.reset();
  s.window_table.reset();
  s.written = 0;
}

std::vector<kv::PrefixIndex*> KvCacheManager::indexes() const {
  if (window_index_) return {index_.get(), window_index_.get()};
  return {index_.get()};
}

kv::PrefixMatch KvCacheManager::combine(const kv::PrefixMatch& full,
                                        const kv::PrefixMatch& window) const {
  kv::PrefixMatch m = full;
  if (window.cached_tokens < full.cached_tokens) {
    // The full layers' table is cut back to the windowed layers' reach.
    const kv::KvGeometry& g = pool_->geometry();
    const size_t kept = std::min(full.shared_blocks, g.blocks_for_tokens(window.cached_tokens));
    m.cached_tokens = window.cached_tokens;
    m.copied_tokens = window.copied_tokens;
    m.shared_unreferenced = std::min(full.shared_unreferenced, kept);
    m.shared_blocks = kept;
    m.miss = window.miss;
  }
  m.shared_blocks += window.shared_blocks;
  m.shared_unreferenced += window.shared_unreferenced;
  return m;
}

std::optional<kv::BlockId> KvCacheManager::take_block() {
  if (auto id = pool_->allocate()) return id;
  // Unpinned blocks first, least recently used across the indexes; pinned ones last.
  for (const bool ignore_pins : {false, true}) {
    kv::PrefixIndex* from = nullptr;
    std::optional<double> oldest;
    for (kv::PrefixIndex* index : indexes()) {
      const std::optional<double> used = index->victim_used_ms(ignore_pins);
      if (used && (!oldest || *used < *oldest)) {
        oldest = used;
        from = index;
      }
    }
    if (from != nullptr && from->evict(1, ignore_pins) == 1) return pool_->allocate();
  }
  return std::nullopt;
}

size_t KvCacheManager::tenant_allowance(const kv::Hash256& ns) const {
  size_t pinned = 0;
  for (const kv::PrefixIndex* index : indexes()) pinned += index->namespace_stats(ns).pinned_blocks;
  return tenant_cap_ - std::min(tenant_cap_, pinned);
}

void KvCacheManager::keep_session(const std::string& session_id, const Sequence& s) {
  if (session_id.empty() || !index_->enabled()) return;
  auto it = sessions_.find(session_id);
  if (it != sessions_.end()) {
    unpin(it->second);
    sessions_.erase(it);
  }
  const size_t max_blocks = std::min(options_.session_max_blocks, tenant_allowance(s.req.ns));
  const std::span<const int32_t> kept(s.tokens.data(), std::min(s.written, s.tokens.size()));
  const kv::PinLease lease = index_->pin(s.req.ns, kept, options_.session_ttl_ms, max_blocks);
  if (lease.id == 0) return;
  Session session{s.req.ns, lease.id, 0, now_ms() + options_.session_ttl_ms};
  if (window_index_) {
    const size_t window_max = std::min(options_.session_max_blocks, tenant_allowance(s.req.ns));
    session.window_lease =
        window_index_->pin(s.req.ns, kept, options_.session_ttl_ms, window_max).id;
  }
  sessions_[session_id] = session;
}

void KvCacheManager::unpin(const Session& session) {
  index_->unpin(session.lease);
  if (window_index_ && session.window_lease != 0) window_index_->unpin(session.window_lease);
}

bool KvCacheManager::close_session(const std::string& session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return false;
  unpin(it->second);
  sessions_.erase(it);
  return true;
}

kv::PinLease KvCacheManager::pin(const kv::Hash256& ns, std::span<const int32_t> tokens,
                                 double ttl_ms) {
  const kv::PinLease lease = index_->pin(ns, tokens, ttl_ms, tenant_allowance(ns));
  // The windowed layers' blocks are pinned as long (their lease ends with its time-to-live).
  if (window_index_ && lease.id != 0) {
    window_index_->pin(ns, tokens.first(lease.tokens), ttl_ms, tenant_allowance(ns));
  }
  return lease;
}

void KvCacheManager::expire() {
  const double now = now_ms();
  std::erase_if(sessions_, [&](const auto& entry) { return entry.second.expires_at_ms <= now; });
  for (kv::PrefixIndex* index : indexes()) index->expire_pins();
}

kv::PrefixMatch KvCacheManager::explain(const kv::Hash256& ns,
                                        std::span<const int32_t> tokens) const {
  const kv::PrefixMatch full = index_->explain(ns, tokens, tokens.empty() ? 0 : tokens.size() - 1);
  if (!window_index_) return full;
  return combine(full, window_index_->explain(ns, tokens, full.cached_tokens));
}

size_t KvCacheManager::flush() {
  size_t n = 0;
  for (kv::PrefixIndex* index : indexes()) n += index->flush();
  // A flush ignores pins: the sessions' and pins' blocks are gone, so are their leases.
  for (const auto& [id, session] : sessions_) unpin(session);
  sessions_.clear();
  return n;
}

KvCacheCounts KvCacheManager::counts() const {
  const kv::PoolCounts c = pool_->counts();
  KvCacheCounts k;
  k.total = c.total;
  k.free = c.free;
  k.referenced = c.referenced;
  k.pinned = 0;
  for (const kv::PrefixIndex* index : indexes()) k.pinned += index->pinned_unreferenced_blocks();
  k.cached = c.cached - std::min(c.cached, k.pinned);
  return k;
}

kv::PrefixIndexStats KvCacheManager::index_stats() const {
  kv::PrefixIndexStats st = index_->stats();
  if (window_index_) {
    // Blocks of both groups; lookups and hits as the full layers' index counts them.
    const kv::PrefixIndexStats w = window_index_->stats();
    st.nodes += w.nodes;
    st.inserted_blocks += w.inserted_blocks;
    st.evicted_blocks += w.evicted_blocks;
  }
  return st;
}

kv::NamespaceStats KvCacheManager::namespace_stats(const kv::Hash256& ns) const {
  kv::NamespaceStats st = index_->namespace_stats(ns);
  if (window_index_) {
    const kv::NamespaceStats w = window_index_->namespace_stats(ns);
    st.blocks += w.blocks;
    st.pinned_blocks += w.pinned_blocks;
  }
  return st;
}

}  // namespace kvc::engine
