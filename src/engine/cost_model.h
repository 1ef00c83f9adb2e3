// The cost model of the KV tiers: what a block costs to recompute (measured from the engine's
// own forward passes) and to load from each tier (measured on every load), what it is worth
// keeping (its reuse rate times what a hit saves), and the decisions that follow: which block
// the pool evicts, whether a block is worth storing in a tier, and whether a tier hit is loaded
// or recomputed.
//
// Reuse: a block is worth writing to a tier only if it will be read back from there, that is,
// if it is wanted again after it has left the pool. The model counts the blocks the engine
// computes and the blocks requests want again: found in the pool, or after the pool evicted
// them (known from the index's ledger of evicted blocks, whether or not a tier held them, so
// the estimate is learnt even while nothing is stored). Their ratio estimates the reads per
// block written: an upper bound while the pool still holds the working set, which costs
// writes only, never a hit. A block is stored when that many reads times what each saves
// (recompute minus load) exceeds the processor time its write takes (the writer shares the
// cores with the forward pass). A block dropped that way but then reused in the pool has
// shown that it is wanted again: when the pool evicts it, it is written if its expected reads,
// at least one, repay the write.
//
// Recompute: a prefill pass of T new tokens at positions p costs about c + a*T + b*sum(p)
// milliseconds (weights are read once per pass; attention grows with the context before each
// token). The three coefficients are fitted by least squares over the engine's passes of at
// least one block, older passes weighing less; a block of B tokens at depth d then costs
// a*B + b*(B*d + B*(B-1)/2), its share of a pass.
//
// Thread-safety: none; the KV cache manager and the engine use it under the engine's state
// mutex.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kv/prefix_index.h"

namespace kvc::engine {

enum class Tier : uint8_t { kDisk, kRedis };
inline constexpr size_t kTierCount = 2;
std::string_view tier_name(Tier t);

// Why a block went (or did not go) where it did.
enum class TierDecision : uint8_t {
  kStored,               // written to the tier: a hit there saves time
  kDroppedCheap,         // not written: recomputing it is faster than loading it
  kLoaded,               // a hit in the tier, loaded into the pool
  kRecomputedFaster,     // a hit in the tier, recomputed because that was faster
  kDroppedSeldomReused,  // not written: blocks are seldom wanted again after eviction
  kStoredWhenEvicted,    // dropped when computed, written when it left the pool after a hit
};
inline constexpr size_t kTierDecisionCount = 6;
std::string_view tier_decision_name(TierDecision d);

// How blocks move between the pool and the tiers.
enum class TierPolicy : uint8_t {
  kCostModel,  // store, load and evict by measured value
  kKeepAll,    // store every block, load every hit, evict the least recently used
};

struct CostModelSnapshot {
  double pass_ms = 0, token_ms = 0, depth_ms = 0;  // c, a, b above
  uint64_t passes = 0;                             // passes fitted
  std::array<double, kTierCount> load_ms{};        // per block
  std::array<uint64_t, kTierCount> loads{};        // loads measured
  // Milliseconds to recompute a block of block_tokens tokens after depth_tokens tokens, by the
  // fitted coefficients (the pass's fixed cost is not the block's).
  double block_recompute_ms(size_t block_tokens, double depth_tokens) const;
  std::array<double, kTierCount> write_ms{};  // processor time per block written
  double tier_reads_per_block = 0;            // expected reads after eviction
};

class CostModel {
 public:
  // block_tokens: tokens per block; load_prior_ms: each tier's load time per block until one is
  // measured (also the prior of its write time).
  CostModel(size_t block_tokens, std::array<double, kTierCount> load_prior_ms);

  // One forward pass: tokens rows whose positions sum to position_sum, taking ms.
  void observe_pass(size_t tokens, double position_sum, double ms);
  // One block loaded from tier in ms.
  void observe_load(Tier tier, double ms);

  // blocks newly computed and indexed (each a candidate for the tiers).
  void observe_computed(size_t blocks);
  // blocks a request wanted again (in the pool, or after they had left it).
  void observe_reuse(size_t blocks);
  // Mean processor time of one block write to tier, as measured by its writer.
  void observe_write(Tier tier, double cpu_ms);
  // Blocks wanted again per block computed: the expected reads from a lower tier of a block
  // written there (a decayed ratio with a prior).
  double tier_reads_per_block() const;
  double write_ms(Tier tier) const { return write_ms_[static_cast<size_t>(tier)]; }
  // Whether to write the block at depth_tokens to tier: kStored, kDroppedCheap (a load would
  // not beat recompute) or kDroppedSeldomReused (expected reads do not repay the write).
  TierDecision store_decision(Tier tier, size_t depth_tokens) const;
  // Whether a block dropped when computed, hit in the pool since and now leaving it, is worth
  // writing to tier: its expected reads (at least the one it has shown) must repay the write.
  bool store_when_evicted(Tier tier, size_t depth_tokens) const;

  // Milliseconds to recompute the block that starts at depth_tokens.
  double recompute_ms(size_t depth_tokens) const;
  double load_ms(Tier tier) const { return load_ms_[static_cast<size_t>(tier)]; }
  // Whether storing the block at depth_tokens in tier can ever pay (a hit loads faster than
  // it recomputes).
  bool worth_storing(Tier tier, size_t depth_tokens) const;
  // Expected reuses per second of a block (frequency of its hits, discounted by its idleness).
  static double reuse_per_second(const kv::BlockFacts& b);
  // The value of keeping a block in the pool, in milliseconds saved per second: its reuse
  // rate times what a hit saves over its next best source (a tier holding it, or recompute).
  double pool_value(const kv::BlockFacts& b, double next_best_ms) const;
  // The reuse probability above which storing a block at depth_tokens in tier pays: the cost
  // of writing it (taken as one load) over what a hit saves; > 1 when it never pays.
  double break_even_reuse(Tier tier, size_t depth_tokens) const;

  void count(Tier tier, TierDecision d) {
    ++decisions_[static_cast<size_t>(tier)][static_cast<size_t>(d)];
  }
  uint64_t decisions(Tier tier, TierDecision d) const {
    return decisions_[static_cast<size_t>(tier)][static_cast<size_t>(d)];
  }
  CostModelSnapshot snapshot() const;
  size_t block_tokens() const { return block_tokens_; }

 private:
  void refit();

  const size_t block_tokens_;
  // Weighted sums of the normal equations over features (1, tokens, position_sum).
  std::array<std::array<double, 3>, 3> xtx_{};
  std::array<double, 3> xty_{};
  double pass_ms_ = 0, token_ms_ = 0, depth_ms_ = 0;
  uint64_t passes_ = 0;
  std::array<double, kTierCount> load_ms_;
  std::array<uint64_t, kTierCount> loads_{};
  std::array<double, kTierCount> write_ms_;
  double computed_weight_, returned_weight_;  // decayed counts, with the prior in them
  std::array<std::array<uint64_t, kTierDecisionCount>, kTierCount> decisions_{};
};

}  // namespace kvc::engine
