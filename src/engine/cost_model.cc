#include "engine/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvc::engine {
namespace {

constexpr double kForget = 0.98;        // weight of a pass falls by a half every ~34 passes
constexpr double kLoadSmoothing = 0.2;  // weight of the newest load in the running average
constexpr double kPositionScale = 1024;
// Reuse is judged over roughly the last thousand blocks computed (a half-life of ~350).
constexpr double kReuseForget = 0.998;
// No reuse is assumed before it is seen (eight blocks' worth of evidence of none): a block
// reused in the pool is still stored when evicted, so the first blocks of a workload that
// returns are not lost, and one that never returns writes nothing.
constexpr double kPriorBlocks = 8, kPriorReads = 0;

// Solves the 3x3 system m x = y by Gaussian elimination with partial pivoting; false when it
// is (nearly) singular.
bool solve3(std::array<std::array<double, 3>, 3> m, std::array<double, 3> y,
            std::array<double, 3>& x) {
  for (int c = 0; c < 3; ++c) {
    int p = c;
    for (int r = c + 1; r < 3; ++r) {
      if (std::fabs(m[r][c]) > std::fabs(m[p][c])) p = r;
    }
    if (std::fabs(m[p][c]) < 1e-12) return false;
    std::swap(m[p], m[c]);
    std::swap(y[p], y[c]);
    for (int r = c + 1; r < 3; ++r) {
      const double f = m[r][c] / m[c][c];
      for (int k = c; k < 3; ++k) m[r][k] -= f * m[c][k];
      y[r] -= f * y[c];
    }
  }
  for (int c = 2; c >= 0; --c) {
    double v = y[c];
    for (int k = c + 1; k < 3; ++k) v -= m[c][k] * x[k];
    x[c] = v / m[c][c];
  }
  return true;
}

}  // namespace

std::string_view tier_name(Tier t) {
  return t == Tier::kDisk ? "disk" : "redis";
}

std::string_view tier_decision_name(TierDecision d) {
  switch (d) {
    case TierDecision::kStored:
      return "stored";
    case TierDecision::kDroppedCheap:
      return "dropped_recompute_cheaper";
    case TierDecision::kLoaded:
      return "loaded";
    case TierDecision::kRecomputedFaster:
      return "recomputed_faster";
    case TierDecision::kDroppedSeldomReused:
      return "dropped_seldom_reused";
    case TierDecision::kStoredWhenEvicted:
      return "stored_when_evicted";
  }
  return "unknown";
}

CostModel::CostModel(size_t block_tokens, std::array<double, kTierCount> load_prior_ms)
    : block_tokens_(std::max<size_t>(1, block_tokens)),
      load_ms_(load_prior_ms),
      write_ms_(load_prior_ms),
      computed_weight_(kPriorBlocks),
      returned_weight_(kPriorReads) {}

void CostModel::observe_computed(size_t blocks) {
  const double keep = std::pow(kReuseForget, static_cast<double>(blocks));
  computed_weight_ = computed_weight_ * keep + static_cast<double>(blocks);
  returned_weight_ *= keep;
}

void CostModel::observe_reuse(size_t blocks) {
  returned_weight_ += static_cast<double>(blocks);
}

void CostModel::observe_write(Tier tier, double cpu_ms) {
  if (cpu_ms >= 0) write_ms_[static_cast<size_t>(tier)] = cpu_ms;
}

double CostModel::tier_reads_per_block() const {
  return returned_weight_ / computed_weight_;
}

TierDecision CostModel::store_decision(Tier tier, size_t depth_tokens) const {
  if (!worth_storing(tier, depth_tokens)) return TierDecision::kDroppedCheap;
  const double saving = recompute_ms(depth_tokens) - load_ms(tier);
  if (std::isinf(saving)) return TierDecision::kStored;  // recompute not measured yet
  return tier_reads_per_block() * saving > write_ms(tier) ? TierDecision::kStored
                                                          : TierDecision::kDroppedSeldomReused;
}

bool CostModel::store_when_evicted(Tier tier, size_t depth_tokens) const {
  // It has been read once; the workload's rate counts when it says more.
  const double reads = std::max(1.0, tier_reads_per_block());
  return reads * (recompute_ms(depth_tokens) - load_ms(tier)) > write_ms(tier);
}

void CostModel::observe_pass(size_t tokens, double position_sum, double ms) {
  if (tokens == 0 || !(ms >= 0)) return;
  const std::array<double, 3> x = {1.0, static_cast<double>(tokens), position_sum / kPositionScale};
  for (auto& row : xtx_) {
    for (double& v : row) v *= kForget;
  }
  for (double& v : xty_) v *= kForget;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) xtx_[i][j] += x[i] * x[j];
    xty_[i] += x[i] * ms;
  }
  ++passes_;
  refit();
}

void CostModel::refit() {
  std::array<double, 3> coef{};
  // A small ridge keeps the fit defined while the passes seen so far are all alike.
  auto m = xtx_;
  for (int i = 0; i < 3; ++i) m[i][i] += 1e-9 * (1 + m[i][i]);
  if (solve3(m, xty_, coef) && coef[0] >= 0 && coef[1] >= 0 && coef[2] >= 0) {
    pass_ms_ = coef[0];
    token_ms_ = coef[1];
    depth_ms_ = coef[2] / kPositionScale;
    return;
  }
  // A negative coefficient means noise swamps that term (the depth term on a short context):
  // fit the other two alone.
  const double det = m[0][0] * m[1][1] - m[0][1] * m[1][0];
  if (std::fabs(det) > 1e-12) {
    const double c = (xty_[0] * m[1][1] - m[0][1] * xty_[1]) / det;
    const double a = (m[0][0] * xty_[1] - m[1][0] * xty_[0]) / det;
    if (c >= 0 && a >= 0) {
      pass_ms_ = c;
      token_ms_ = a;
      depth_ms_ = 0;
      return;
    }
  }
  // Otherwise the whole time per token, no fixed or depth term (an over-estimate of
  // recompute, which errs towards keeping blocks).
  pass_ms_ = 0;
  depth_ms_ = 0;
  token_ms_ = xtx_[0][1] > 0 ? xty_[0] / xtx_[0][1] : 0;
}

void CostModel::observe_load(Tier tier, double ms) {
  const auto t = static_cast<size_t>(tier);
  load_ms_[t] = loads_[t] == 0 ? ms : (1 - kLoadSmoothing) * load_ms_[t] + kLoadSmoothing * ms;
  ++loads_[t];
}

double CostModelSnapshot::block_recompute_ms(size_t block_tokens, double depth_tokens) const {
  const auto b = static_cast<double>(block_tokens);
  return token_ms * b + depth_ms * (b * depth_tokens + b * (b - 1) / 2);
}

double CostModel::recompute_ms(size_t depth_tokens) const {
  if (passes_ == 0) return std::numeric_limits<double>::infinity();  // unknown: assume dear
  CostModelSnapshot fit;
  fit.token_ms = token_ms_;
  fit.depth_ms = depth_ms_;
  return fit.block_recompute_ms(block_tokens_, static_cast<double>(depth_tokens));
}

bool CostModel::worth_storing(Tier tier, size_t depth_tokens) const {
  return recompute_ms(depth_tokens) > load_ms(tier);
}

double CostModel::reuse_per_second(const kv::BlockFacts& b) {
  const double age_s = std::max(1.0, b.age_ms / 1000.0);
  const double uses = b.hits + 1.0;
  const double rate = uses / age_s;
  // The longer it has been idle compared with its usual interval, the less likely it returns.
  return rate / (1.0 + (b.idle_ms / 1000.0) * rate);
}

double CostModel::pool_value(const kv::BlockFacts& b, double next_best_ms) const {
  return reuse_per_second(b) * next_best_ms;
}

double CostModel::break_even_reuse(Tier tier, size_t depth_tokens) const {
  const double saving = recompute_ms(depth_tokens) - load_ms(tier);
  if (saving <= 0) return std::numeric_limits<double>::infinity();
  return load_ms(tier) / saving;
}

CostModelSnapshot CostModel::snapshot() const {
  CostModelSnapshot s;
  s.pass_ms = pass_ms_;
  s.token_ms = token_ms_;
  s.depth_ms = depth_ms_;
  s.passes = passes_;
  s.load_ms = load_ms_;
  s.loads = loads_;
  s.write_ms = write_ms_;
  s.tier_reads_per_block = tier_reads_per_block();
  return s;
}

}  // namespace kvc::engine
