#include "kv/prefix_index.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "base/error.h"

namespace kvc::kv {

Clock steady_clock_ms() {
  return [] {
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
}

std::string MissReason::kind_name() const {
  switch (kind) {
    case MissKind::kNone:
      return "none";
    case MissKind::kCold:
      return "cold";
    case MissKind::kDiverged:
      return "diverged";
    case MissKind::kEvicted:
      return "evicted";
    case MissKind::kPartialBlock:
      return "partial_block";
    case MissKind::kQuota:
      return "quota";
    case MissKind::kDisabled:
      return "disabled";
  }
  return "?";
}

std::string MissReason::to_string(double now_ms) const {
  switch (kind) {
    case MissKind::kDiverged:
      return fmt::format("diverged@{}", at_token);
    case MissKind::kEvicted:
      return fmt::format("evicted@{:.1f}s-ago", std::max(0.0, now_ms - evicted_at_ms) / 1e3);
    default:
      return kind_name();
  }
}

namespace {
// Orders children by their token ids and lets lookups use a span of the prompt directly, so
// a match allocates nothing per block.
struct TokensLess {
  using is_transparent = void;
  static bool less(std::span<const int32_t> a, std::span<const int32_t> b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }
  bool operator()(const std::vector<int32_t>& a, const std::vector<int32_t>& b) const {
    return less(a, b);
  }
  bool operator()(std::span<const int32_t> a, const std::vector<int32_t>& b) const {
    return less(a, b);
  }
  bool operator()(const std::vector<int32_t>& a, std::span<const int32_t> b) const {
    return less(a, b);
  }
};
}  // namespace

struct PrefixIndex::Node {
  Node* parent = nullptr;
  Space* space = nullptr;
  std::vector<int32_t> tokens;           // this node's key under its parent: a block's token ids
  BlockId block = BlockTable::kNoBlock;  // kNoBlock: hollow (evicted, under a window)
  Hash256 hash{};
  std::map<std::vector<int32_t>, std::unique_ptr<Node>, TokensLess> children;
  uint64_t last_access = 0;
  uint32_t depth = 0;  // blocks from the root, the root being 0
  uint32_t hits = 0;   // times a match reused it
  double created_ms = 0;
  double used_ms = 0;
  std::vector<std::pair<uint64_t, double>> pins;  // (lease, expiry) of the leases covering it
  bool in_lru = false;
  bool partial = false;
  uint8_t tag = 0;  // the owner's note, kept in the ledger after eviction
};

struct PrefixIndex::Space {
  Hash256 ns{};
  Node root;
  size_t blocks = 0;
  size_t quota = 0;
  uint64_t queried_tokens = 0;
  uint64_t hit_tokens = 0;
};

// The outcome of following tokens down the tree, before any side effect.
struct PrefixIndex::Walk {
  const Space* space = nullptr;
  std::vector<Node*> path;  // whole blocks matched
  Node* partial = nullptr;  // the child sharing the longest run with the next tokens
  size_t partial_tokens = 0;
  size_t full_tokens = 0;
  MissReason miss;
};

size_t PrefixIndex::HashKey::operator()(const Hash256& h) const {
  size_t v;
  std::memcpy(&v, h.data(), sizeof(v));
  return v;
}

PrefixIndex::PrefixIndex(BlockPool& pool, PrefixIndexOptions options, Clock clock)
    : pool_(pool),
      options_(options),
      geometry_(pool.geometry().group(0)),
      clock_(std::move(clock)) {
  if (options_.window_tokens >= 0) geometry_.window_tokens = options_.window_tokens;
  window_ = static_cast<size_t>(geometry_.window_tokens);
  node_of_block_.assign(pool.num_blocks(), nullptr);
  // A partly filled block's keys grouped per channel are not in it yet, and its first tokens'
  // keys would be quantised with other tokens than a cold run's: such blocks are neither
  // indexed nor copied, and a match stops at the last whole block.
  if (pool.geometry().keys_by_channel()) options_.partial_reuse = false;
}

PrefixIndex::~PrefixIndex() = default;

std::optional<BlockId> PrefixIndex::take_block() {
  if (auto id = pool_.allocate()) return id;
  if (evict(1) == 0) return std::nullopt;
  return pool_.allocate();
}

PrefixIndex::Space& PrefixIndex::space(const Hash256& ns) {
  auto& slot = spaces_[ns];
  if (!slot) {
    slot = std::make_unique<Space>();
    slot->ns = ns;
    slot->root.space = slot.get();
  }
  return *slot;
}

const PrefixIndex::Space* PrefixIndex::find_space(const Hash256& ns) const {
  auto it = spaces_.find(ns);
  return it == spaces_.end() ? nullptr : it->second.get();
}

namespace {
size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}
}  // namespace

PrefixIndex::Walk PrefixIndex::walk(const Hash256& ns, std::span<const int32_t> tokens,
                                    size_t limit) const {
  Walk w;
  limit = std::min(limit, tokens.size());
  if (!options_.enabled) {
    w.miss = {MissKind::kDisabled, 0, 0};
    return w;
  }
  w.space = find_space(ns);
  const size_t block = geometry_.block_tokens;
  if (w.space == nullptr) {
    if (limit == 0) return w;
    w.miss = {MissKind::kCold, 0, 0};
    // A namespace emptied by eviction is dropped, but the ledger still knows its first block.
    if (block <= tokens.size()) {
      auto gone = ledger_.find(chain_hash(ns, Hash256{}, tokens.subspan(0, block)));
      if (gone != ledger_.end()) w.miss = {gone->second.kind, 0, gone->second.at_ms};
    }
    return w;
  }
  const Node* node = &w.space->root;
  size_t pos = 0;
  while (pos + block <= limit) {
    auto it = node->children.find(tokens.subspan(pos, block));
    if (it == node->children.end() || it->second->partial) break;
    node = it->second.get();
    w.path.push_back(it->second.get());
    pos += block;
  }
  w.full_tokens = pos;
  if (pos >= limit) return w;

  // The child sharing the longest run with the next tokens sits next to where those tokens
  // would be inserted in the lexicographically ordered children.
  const std::span<const int32_t> rest = tokens.subspan(pos, std::min(block, limit - pos));
  auto it = node->children.lower_bound(rest);
  for (auto candidate : {it, it == node->children.begin() ? node->children.end() : std::prev(it)}) {
    if (candidate == node->children.end() || candidate->second->block < 0) continue;
    const size_t run = common_prefix(candidate->second->tokens, rest);
    if (run > w.partial_tokens) {
      w.partial_tokens = run;
      w.partial = candidate->second.get();
    }
  }
  const size_t reusable = options_.partial_reuse ? w.partial_tokens : 0;
  const size_t stop = pos + reusable;
  if (stop >= limit) return w;

  // A remembered eviction of the very next block explains the miss best.
  if (pos + block <= tokens.size()) {
    const Hash256 next = chain_hash(ns, node->hash, tokens.subspan(pos, block));
    auto gone = ledger_.find(next);
    if (gone != ledger_.end()) {
      w.miss = {gone->second.kind, stop, gone->second.at_ms};
      return w;
    }
  }
  if (w.partial_tokens > 0 && !options_.partial_reuse) {
    w.miss = {MissKind::kPartialBlock, stop, 0};
  } else if (!node->children.empty() && !(w.partial != nullptr && w.partial->partial &&
                                          w.partial_tokens == w.partial->tokens.size())) {
    w.miss = {MissKind::kDiverged, stop, 0};
  } else {
    w.miss = {MissKind::kCold, stop, 0};
  }
  return w;
}

size_t PrefixIndex::first_held(size_t cached) const {
  return geometry_.first_needed(cached) / static_cast<size_t>(geometry_.block_tokens);
}

size_t PrefixIndex::window_fit(const std::vector<Node*>& path, size_t full) const {
  const auto bt = static_cast<size_t>(geometry_.block_tokens);
  size_t j = full;
  // A hollow block h rules out every end j > h whose window reaches it; the next end to try is
  // h itself, so each block is looked at about once.
  while (j > 0) {
    const size_t first = first_held(j * bt);
    size_t hollow = j;
    for (size_t i = j; i-- > first;) {
      if (path[i]->block < 0) {
        hollow = i;
        break;
      }
    }
    if (hollow == j) return j;
    j = hollow;
  }
  return 0;
}

bool PrefixIndex::fit_window(Walk& w) const {
  if (window_ == 0) return false;
  const auto bt = static_cast<size_t>(geometry_.block_tokens);
  const size_t full = w.path.size();
  const size_t reusable = options_.partial_reuse ? w.partial_tokens : 0;
  if (reusable > 0) {
    // The copied block is present; the window of the token after it must find the rest.
    bool present = true;
    for (size_t i = first_held(full * bt + reusable); i < full && present; ++i) {
      present = w.path[i]->block >= 0;
    }
    if (present) return false;
  }
  const size_t fit = window_fit(w.path, full);
  if (fit == full) return false;
  // The block the cut stops at is hollow: the ledger says when it left.
  const Node* gone = w.path[fit];
  auto it = ledger_.find(gone->hash);
  w.miss = it == ledger_.end() ? MissReason{MissKind::kEvicted, fit * bt, 0}
                               : MissReason{it->second.kind, fit * bt, it->second.at_ms};
  w.path.resize(fit);
  w.full_tokens = fit * bt;
  w.partial = nullptr;
  w.partial_tokens = 0;
  return true;
}

PrefixMatch PrefixIndex::explain(const Hash256& ns, std::span<const int32_t> tokens,
                                 size_t limit) const {
  Walk w = walk(ns, tokens, limit);
  fit_window(w);
  PrefixMatch m;
  m.copied_tokens = options_.partial_reuse ? w.partial_tokens : 0;
  m.cached_tokens = w.full_tokens + m.copied_tokens;
  const size_t holes = first_held(m.cached_tokens);
  m.shared_blocks = w.path.size() - holes;
  if (!w.path.empty()) m.last_shared_hash = w.path.back()->hash;
  for (size_t i = holes; i < w.path.size(); ++i) {
    m.shared_unreferenced += pool_.ref_count(w.path[i]->block) == 0;
  }
  m.miss = w.miss;
  return m;
}

PrefixMatch PrefixIndex::match(const Hash256& ns, std::span<const int32_t> tokens, size_t limit,
                               BlockTable& table, bool counted) {
  if (!table.blocks().empty()) fail("prefix match needs an empty block table");
  Walk w = walk(ns, tokens, limit);
  fit_window(w);
  PrefixMatch m;
  m.miss = w.miss;
  const size_t reusable = options_.partial_reuse ? w.partial_tokens : 0;
  // Shares the first n blocks of the path, holes where the window of position `tokens` ends
  // no longer reads them.
  const auto share = [&](size_t n, size_t cached) {
    table.clear();
    m.shared_unreferenced = 0;
    const size_t holes = std::min(n, first_held(cached));
    for (size_t i = 0; i < n; ++i) {
      if (i < holes) {
        table.append_hole();
        continue;
      }
      m.shared_unreferenced += pool_.ref_count(w.path[i]->block) == 0;
      table.append_shared(w.path[i]->block);
    }
    m.shared_blocks = n - holes;
    m.cached_tokens = n * static_cast<size_t>(geometry_.block_tokens);
    m.last_shared_hash = n == 0 ? Hash256{} : w.path[n - 1]->hash;
  };
  share(w.path.size(), w.full_tokens + reusable);
  if (reusable > 0) {
    // Hold the source while allocating, so the eviction an allocation may trigger cannot
    // take it. (Kept apart from the walk, whose partial a window's cut below may drop.)
    Node* const source = w.partial;
    pool_.retain(source->block);
    const auto fresh = table.source().take_block();
    if (fresh) {
      pool_.copy_tokens(source->block, *fresh, static_cast<int>(w.partial_tokens));
      table.append_owned(*fresh);
      m.copied_tokens = w.partial_tokens;
      m.cached_tokens += w.partial_tokens;
      touch(source);
      source->hits += counted;  // a copy reuses it too
      source->used_ms = clock_();
    } else {
      m.miss = {MissKind::kPartialBlock, m.cached_tokens, 0};
      if (window_ > 0) {
        // Without the copy the window reaches further back. The failed allocation evicted
        // nothing, so the walk's nodes are as they were.
        w.partial_tokens = 0;
        if (fit_window(w)) m.miss = w.miss;
        share(w.path.size(), w.full_tokens);
      }
    }
    pool_.release(source->block);
  }
  for (size_t i = w.path.size() - m.shared_blocks; i < w.path.size(); ++i) {
    Node* n = w.path[i];
    touch(n);
    n->hits += counted;
    n->used_ms = clock_();
  }
  if (options_.enabled && counted) {
    // The sequence's insert() drops the namespace again if it ends up caching nothing.
    Space& sp = space(ns);
    sp.queried_tokens += tokens.size();
    sp.hit_tokens += m.cached_tokens;
    stats_.queried_tokens += tokens.size();
    stats_.hit_tokens += m.cached_tokens;
  }
  return m;
}

PrefixIndex::Node* PrefixIndex::add_child(Space& sp, Node& parent, std::vector<int32_t> key,
                                          BlockId block) {
  auto node = std::make_unique<Node>();
  Node* n = node.get();
  n->parent = &parent;
  n->space = &sp;
  n->block = block;
  n->partial = key.size() < static_cast<size_t>(geometry_.block_tokens);
  n->hash = chain_hash(sp.ns, parent.hash, key);
  n->tokens = key;
  n->depth = parent.depth + 1;
  n->created_ms = n->used_ms = clock_();
  if (window_ == 0) lru_remove(&parent);  // no longer a leaf
  parent.children.emplace(std::move(key), std::move(node));
  node_of_block_[block] = n;
  pool_.set_cacheable(block, true);
  ++sp.blocks;
  ++stats_.nodes;
  ++stats_.inserted_blocks;
  if (auto gone = ledger_.find(n->hash); gone != ledger_.end()) ledger_.erase(gone);
  n->last_access = ++tick_;
  lru_add(n);
  return n;
}

std::vector<IndexedBlock> PrefixIndex::insert(const Hash256& ns, std::span<const int32_t> tokens,
                                              size_t n_tokens, const BlockTable& table,
                                              bool include_partial) {
  std::vector<IndexedBlock> added;
  insert_blocks(ns, tokens, n_tokens, table, include_partial && !geometry_.keys_by_channel(),
                added);
  drop_if_empty(find_space(ns));
  return added;
}

void PrefixIndex::insert_blocks(const Hash256& ns, std::span<const int32_t> tokens, size_t n_tokens,
                                const BlockTable& table, bool include_partial,
                                std::vector<IndexedBlock>& added) {
  if (!options_.enabled) return;
  const size_t block = geometry_.block_tokens;
  n_tokens = std::min(n_tokens, tokens.size());
  if (table.blocks().size() < geometry_.blocks_for_tokens(n_tokens)) {
    fail("insert: {} tokens need {} blocks, the table has {}", n_tokens,
         geometry_.blocks_for_tokens(n_tokens), table.blocks().size());
  }
  Space& sp = space(ns);
  Node* node = &sp.root;
  const size_t full = n_tokens / block;
  for (size_t i = 0; i <= full; ++i) {
    const size_t begin = i * block;
    const size_t end = std::min(begin + block, n_tokens);
    if (end == begin || (end - begin < block && !include_partial)) return;
    const std::span<const int32_t> key = tokens.subspan(begin, end - begin);
    auto it = node->children.find(key);
    if (it != node->children.end()) {  // already cached, perhaps in another block
      node = it->second.get();
      if (i < table.first_held() || node_of_block_[table.blocks()[i]] != nullptr) continue;
      if (node->block < 0) {
        // A hollow node takes the block the sequence recomputed.
        if (!make_room(sp, node)) {
          // Making room may have taken the children that kept it in the tree.
          prune_hollow(node);
          return;
        }
        refill(node, table.blocks()[i]);
        if (!node->partial) added.push_back({node->hash, node->block, begin});
      } else if (pool_.state(node->block) == BlockState::kCached) {
        // The sequence recomputed a block the tree holds unreferenced (a window's cut of its
        // cached prefix, or two sequences computing one prefix): the node takes the sequence's
        // copy, the same bits by the exactness invariant, and the old one is freed. Kept, it
        // would sit above the sequence's blocks as an inner node no eviction can take.
        adopt(node, table.blocks()[i]);
      }
      continue;
    }
    if (i < table.first_held()) return;  // a hole the tree does not know: nothing to chain on
    if (key.size() < block) {
      // A full block that starts with these tokens already serves them by copy.
      auto next = node->children.lower_bound(key);
      if (next != node->children.end() && common_prefix(next->first, key) == key.size()) return;
    }
    const BlockId b = table.blocks()[i];
    if (node_of_block_[b] != nullptr) return;  // the block is indexed under other tokens
    if (!make_room(sp, node)) {
      remember(chain_hash(ns, node->hash, key), MissKind::kQuota);
      prune_hollow(node);
      return;
    }
    node = add_child(sp, *node, std::vector<int32_t>(key.begin(), key.end()), b);
    if (node->partial) return;
    added.push_back({node->hash, b, begin});
  }
}

bool PrefixIndex::make_room(Space& sp, const Node* keep) {
  while (sp.quota != 0 && sp.blocks >= sp.quota) {
    Node* victim = oldest_evictable(&sp, false, keep);
    if (victim == nullptr) return false;
    remove_block(victim, MissKind::kQuota, keep);
  }
  return true;
}

bool PrefixIndex::pinned(const Node& n) const {
  if (n.pins.empty()) return false;
  const double now = clock_();
  return std::any_of(n.pins.begin(), n.pins.end(), [&](const auto& p) { return p.second > now; });
}

bool PrefixIndex::lru_member(const Node& n) const {
  return n.parent != nullptr && n.block >= 0 && (window_ > 0 || n.children.empty());
}

bool PrefixIndex::evictable(const Node& n, bool ignore_pins) const {
  return lru_member(n) && pool_.state(n.block) == BlockState::kCached &&
         (ignore_pins || !pinned(n));
}

void PrefixIndex::drop_if_empty(const Space* sp) {
  if (sp == nullptr || sp->blocks != 0 || sp->quota != 0) return;
  spaces_.erase(sp->ns);
}

PrefixIndex::Node* PrefixIndex::oldest_evictable(const Space* only, bool ignore_pins,
                                                 const Node* keep) const {
  for (const auto& [access, n] : lru_) {
    if (n != keep && (only == nullptr || n->space == only) && evictable(*n, ignore_pins)) return n;
  }
  return nullptr;
}

void PrefixIndex::remove_block(Node* n, MissKind why, const Node* keep) {
  remember(n->hash, why, n->tag);
  lru_remove(n);
  pool_.free_cached(n->block);
  node_of_block_[n->block] = nullptr;
  n->block = BlockTable::kNoBlock;
  --n->space->blocks;
  --stats_.nodes;
  ++stats_.evicted_blocks;
  prune_hollow(n, keep);
}

void PrefixIndex::prune_hollow(Node* n, const Node* keep) {
  // A hollow node without children leads nowhere: it leaves the tree, and so does each hollow
  // ancestor it alone kept.
  while (n != keep && n->parent != nullptr && n->block < 0 && n->children.empty()) {
    Node* parent = n->parent;
    parent->children.erase(parent->children.find(n->tokens));  // destroys n
    n = parent;
  }
  if (lru_member(*n)) lru_add(n);  // a parent that became a leaf
}

void PrefixIndex::adopt(Node* n, BlockId b) {
  pool_.free_cached(n->block);
  node_of_block_[n->block] = nullptr;
  n->block = b;
  node_of_block_[b] = n;
  pool_.set_cacheable(b, true);
}

void PrefixIndex::refill(Node* n, BlockId b) {
  n->block = b;
  node_of_block_[b] = n;
  pool_.set_cacheable(b, true);
  ++n->space->blocks;
  ++stats_.nodes;
  ++stats_.inserted_blocks;
  if (auto gone = ledger_.find(n->hash); gone != ledger_.end()) ledger_.erase(gone);
  n->created_ms = n->used_ms = clock_();
  n->hits = 0;
  n->last_access = ++tick_;
  lru_add(n);
}

BlockFacts PrefixIndex::facts_of(const Node& n, double now) const {
  BlockFacts f;
  f.hash = n.hash;
  f.depth_tokens = (n.depth - 1) * static_cast<size_t>(geometry_.block_tokens);
  f.hits = n.hits;
  f.age_ms = now - n.created_ms;
  f.idle_ms = now - n.used_ms;
  return f;
}

PrefixIndex::Node* PrefixIndex::victim(bool ignore_pins) const {
  if (!options_.block_value) return oldest_evictable(nullptr, ignore_pins);
  Node* best = nullptr;
  double best_value = 0;
  size_t seen = 0;
  const double now = clock_();
  for (const auto& [access, n] : lru_) {
    if (!evictable(*n, ignore_pins)) continue;
    const double v = options_.block_value(facts_of(*n, now));
    if (best == nullptr || v < best_value) {
      best = n;
      best_value = v;
    }
    if (++seen == options_.value_sample) break;
  }
  return best;
}

std::optional<double> PrefixIndex::victim_used_ms(bool ignore_pins) const {
  const Node* n = victim(ignore_pins);
  if (n == nullptr) return std::nullopt;
  return n->used_ms;
}

size_t PrefixIndex::evict(size_t n, bool ignore_pins) {
  size_t done = 0;
  while (done < n) {
    Node* victim = this->victim(ignore_pins);
    if (victim == nullptr) break;
    const Space* sp = victim->space;
    if (options_.on_evict) {
      victim->tag =
          options_.on_evict({sp->ns, victim->block, facts_of(*victim, clock_()), victim->tag});
    }
    remove_block(victim, MissKind::kEvicted);
    drop_if_empty(sp);
    ++done;
  }
  return done;
}

size_t PrefixIndex::flush() {
  size_t done = 0;
  while (Node* victim = oldest_evictable(nullptr, true)) {
    const Space* sp = victim->space;
    remove_block(victim, MissKind::kEvicted);
    drop_if_empty(sp);
    ++done;
  }
  return done;
}

void PrefixIndex::touch(Node* n) {
  if (n->in_lru) {
    lru_.erase({n->last_access, n});
    n->last_access = ++tick_;
    lru_.insert({n->last_access, n});
  } else {
    n->last_access = ++tick_;
  }
}

void PrefixIndex::lru_add(Node* n) {
  if (n->in_lru) return;
  lru_.insert({n->last_access, n});
  n->in_lru = true;
}

void PrefixIndex::lru_remove(Node* n) {
  if (!n->in_lru) return;
  lru_.erase({n->last_access, n});
  n->in_lru = false;
}

void PrefixIndex::visit_cached(const std::function<uint8_t(const LeavingBlock&)>& fn) {
  const double now = clock_();
  for (Node* n : node_of_block_) {
    if (n != nullptr) n->tag = fn({n->space->ns, n->block, facts_of(*n, now), n->tag});
  }
}

void PrefixIndex::tag_block(BlockId block, uint8_t tag) {
  const auto i = static_cast<size_t>(block);
  if (i < node_of_block_.size() && node_of_block_[i] != nullptr) node_of_block_[i]->tag = tag;
}

std::optional<EvictedBlock> PrefixIndex::evicted(const Hash256& hash) const {
  const auto it = ledger_.find(hash);
  if (it == ledger_.end()) return std::nullopt;
  return EvictedBlock{it->second.kind, it->second.at_ms, it->second.tag};
}

void PrefixIndex::remember(const Hash256& hash, MissKind kind, uint8_t tag) {
  if (options_.ledger_capacity == 0) return;
  const uint64_t stamp = ++ledger_stamp_;
  ledger_.insert_or_assign(hash, LedgerEntry{kind, clock_(), stamp, tag});
  ledger_order_.emplace_back(hash, stamp);
  // An order entry whose hash was re-inserted or re-remembered since is stale: expiring it
  // must not drop the newer record.
  while (ledger_order_.size() > options_.ledger_capacity) {
    const auto& [old, old_stamp] = ledger_order_.front();
    auto it = ledger_.find(old);
    if (it != ledger_.end() && it->second.stamp == old_stamp) ledger_.erase(it);
    ledger_order_.pop_front();
  }
}

PinLease PrefixIndex::pin(const Hash256& ns, std::span<const int32_t> tokens, double ttl_ms,
                          size_t max_blocks) {
  if (!(ttl_ms > 0)) fail("pin: time-to-live must be positive, got {} ms", ttl_ms);
  const Walk w = walk(ns, tokens, tokens.size());
  // Under a window the prefix's continuation reads only the blocks of its last window: those
  // are the ones worth keeping (up to max_blocks of them, the last ones).
  const size_t blocks = window_ > 0 ? w.path.size() : std::min(w.path.size(), max_blocks);
  if (blocks == 0 || max_blocks == 0) return {};
  const size_t first = window_ > 0 ? std::max(first_held(blocks * geometry_.block_tokens),
                                              blocks - std::min(blocks, max_blocks))
                                   : 0;
  const uint64_t id = next_lease_++;
  const double until = clock_() + ttl_ms;
  for (size_t i = first; i < blocks; ++i) w.path[i]->pins.emplace_back(id, until);
  const size_t n_tokens = blocks * static_cast<size_t>(geometry_.block_tokens);
  leases_.emplace(
      id, Lease{ns, std::vector<int32_t>(tokens.begin(), tokens.begin() + n_tokens), until});
  return {id, n_tokens};
}

bool PrefixIndex::unpin(uint64_t lease) {
  auto it = leases_.find(lease);
  if (it == leases_.end()) return false;
  // The lease's blocks are found again by their tokens: some may have been evicted since (a
  // flush ignores pins), and only the live ones carry the lease.
  const Walk w = walk(it->second.ns, it->second.tokens, it->second.tokens.size());
  for (Node* n : w.path) {
    std::erase_if(n->pins, [&](const auto& p) { return p.first == lease; });
  }
  leases_.erase(it);
  return true;
}

size_t PrefixIndex::expire_pins() {
  const double now = clock_();
  std::vector<uint64_t> expired;
  for (const auto& [id, lease] : leases_) {
    if (lease.until <= now) expired.push_back(id);
  }
  for (uint64_t id : expired) unpin(id);
  return expired.size();
}

size_t PrefixIndex::pinned_unreferenced_blocks() const {
  size_t n = 0;
  for (const Node* node : node_of_block_) {
    if (node != nullptr && pool_.ref_count(node->block) == 0 && pinned(*node)) ++n;
  }
  return n;
}

void PrefixIndex::set_quota(const Hash256& ns, size_t max_blocks) {
  Space& sp = space(ns);
  sp.quota = max_blocks;
  while (max_blocks != 0 && sp.blocks > max_blocks) {
    Node* victim = oldest_evictable(&sp, false);
    if (victim == nullptr) break;
    remove_block(victim, MissKind::kQuota);
  }
  drop_if_empty(&sp);
}

PrefixIndexStats PrefixIndex::stats() const {
  PrefixIndexStats s = stats_;
  s.namespaces = spaces_.size();
  return s;
}

NamespaceStats PrefixIndex::namespace_stats(const Hash256& ns) const {
  const Space* sp = find_space(ns);
  if (sp == nullptr) return {};
  size_t pinned_blocks = 0;
  std::vector<const Node*> stack = {&sp->root};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const auto& [key, child] : n->children) {
      pinned_blocks += child->block >= 0 && pinned(*child);
      stack.push_back(child.get());
    }
  }
  return NamespaceStats{sp->blocks, pinned_blocks, sp->quota, sp->queried_tokens, sp->hit_tokens};
}

size_t PrefixIndex::index_bytes() const {
  // A node, its key, its entry in the parent's map (a red-black tree node of about 48 bytes
  // plus the key vector) and its LRU set entry.
  const size_t per_node = sizeof(Node) + 48 + sizeof(std::vector<int32_t>) +
                          2 * sizeof(int32_t) * geometry_.block_tokens + 48;
  return stats_.nodes * per_node + node_of_block_.size() * sizeof(Node*) +
         ledger_.size() * (sizeof(Hash256) * 2 + sizeof(LedgerEntry) + 16);
}

void PrefixIndex::check_invariants() const {
  size_t nodes = 0;
  for (const auto& [ns, sp] : spaces_) {
    size_t in_space = 0;
    std::vector<const Node*> stack = {&sp->root};
    while (!stack.empty()) {
      const Node* n = stack.back();
      stack.pop_back();
      for (const auto& [key, child] : n->children) {
        if (child->parent != n || child->tokens != key || child->space != sp.get()) {
          fail("prefix index: node links are inconsistent");
        }
        if (child->block < 0) {
          if (window_ == 0 || child->children.empty()) {
            fail("prefix index: a hollow node must be an inner node under a window");
          }
        } else if (node_of_block_[child->block] != child.get() || !pool_.cacheable(child->block) ||
                   pool_.state(child->block) == BlockState::kFree) {
          fail("prefix index: block {} of a node is not held as cached", child->block);
        } else {
          ++in_space;
        }
        if (child->in_lru != lru_member(*child)) {
          fail("prefix index: the LRU list must hold exactly the evictable kind of node");
        }
        if (child->partial && !child->children.empty()) fail("prefix index: partial inner node");
        stack.push_back(child.get());
      }
    }
    if (in_space != sp->blocks) fail("prefix index: namespace block count is off");
    nodes += in_space;
  }
  if (nodes != stats_.nodes || lru_.size() > nodes) fail("prefix index: node count is off");
  if (options_.shares_pool) return;
  size_t cacheable_cached = 0;
  for (size_t b = 0; b < node_of_block_.size(); ++b) {
    if (pool_.state(static_cast<BlockId>(b)) == BlockState::kCached) {
      ++cacheable_cached;
      if (node_of_block_[b] == nullptr) fail("prefix index: cached block {} has no node", b);
    }
  }
  const PoolCounts c = pool_.counts();
  if (c.free + c.cached + c.referenced != c.total || c.cached != cacheable_cached) {
    fail("block accounting: free {} + cached {} + referenced {} != total {}", c.free, c.cached,
         c.referenced, c.total);
  }
}

}  // namespace kvc::kv
