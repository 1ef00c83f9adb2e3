#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <unordered_set>

#include "base/error.h"

namespace kvc::model {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    fail("temperature must be a finite number >= 0, got {}", temperature);
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) fail("top_p must be in (0, 1], got {}", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) fail("min_p must be in [0, 1], got {}", min_p);
  if (!(repeat_penalty > 0.0f) || !std::isfinite(repeat_penalty)) {
    fail("repeat_penalty must be a finite number > 0, got {}", repeat_penalty);
  }
  if (repeat_last_n < 0) fail("repeat_last_n must be >= 0, got {}", repeat_last_n);
}

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}
}  // namespace

Rng::Rng(uint64_t seed) {
  for (uint64_t& s : s_) s = splitmix64(seed);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

int32_t argmax(std::span<const float> logits) {
  // The largest value through independent lanes (which the compiler turns into vector maxima,
  // where one running maximum is a chain of dependent compares), then its first index.
  constexpr size_t kLanes = 16;
  float lane_max[kLanes];
  std::fill(std::begin(lane_max), std::end(lane_max), -std::numeric_limits<float>::infinity());
  size_t i = 0;
  for (; i + kLanes <= logits.size(); i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const float v = logits[i + j];
      lane_max[j] = v > lane_max[j] ? v : lane_max[j];
    }
  }
  float max = -std::numeric_limits<float>::infinity();
  for (float v : lane_max) max = v > max ? v : max;
  for (; i < logits.size(); ++i) max = logits[i] > max ? logits[i] : max;
  const auto first = std::find(logits.begin(), logits.end(), max);
  return first == logits.end() ? 0 : static_cast<int32_t>(first - logits.begin());
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  params_.validate();
}

std::vector<TokenProb> Sampler::candidates(std::span<const float> logits,
                                           std::span<const int32_t> history) const {
  // The logits as sampled: the model's, or a copy with recent tokens penalised.
  std::span<const float> scored = logits;
  std::vector<float> adjusted;
  if (params_.repeat_penalty != 1.0f && params_.repeat_last_n > 0) {
    adjusted.assign(logits.begin(), logits.end());
    // As llama.cpp: each distinct recent token is penalised once, dividing positive logits
    // and multiplying negative ones.
    const size_t n = std::min(history.size(), static_cast<size_t>(params_.repeat_last_n));
    std::unordered_set<int32_t> seen(history.end() - n, history.end());
    for (int32_t id : seen) {
      if (id < 0 || static_cast<size_t>(id) >= adjusted.size()) continue;
      float& l = adjusted[id];
      l = l > 0.0f ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    }
    scored = adjusted;
  }
  if (params_.temperature < kGreedyTemperature) return {TokenProb{argmax(scored), 1.0f}};
  // A NaN would break the sort's ordering and every sum after it: it ranks below every number.
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  std::vector<TokenProb> c(scored.size());
  for (size_t i = 0; i < scored.size(); ++i) {
    c[i] = {static_cast<int32_t>(i), std::isnan(scored[i]) ? kNever : scored[i]};
  }
  // Descending by logit, ties by id, so truncation is deterministic.
  const auto by_logit = [](const TokenProb& a, const TokenProb& b) {
    return a.p > b.p || (a.p == b.p && a.id < b.id);
  };
  size_t keep = c.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(c.begin(), c.begin() + keep, c.end(), by_logit);
    c.resize(keep);
  } else {
    std::sort(c.begin(), c.end(), by_logit);
  }
  // Softmax of the sorted logits times logit_scale. When the largest logit is infinite (a
  // model's, or a penalty's overflow), exp would give inf/inf: the candidates equal to it share
  // the probability instead (all of them when every logit is -inf).
  const auto softmax = [](const std::vector<TokenProb>& v, float logit_scale) {
    const float max = v.front().p;
    std::vector<float> p(v.size(), 0.0f);
    if (std::isinf(max)) {
      size_t tied = 0;
      while (tied < v.size() && v[tied].p == max) ++tied;
      for (size_t i = 0; i < tied; ++i) p[i] = static_cast<float>(1.0 / static_cast<double>(tied));
      return p;
    }
    double sum = 0.0;
    std::vector<double> e(v.size());
    for (size_t i = 0; i < v.size(); ++i) sum += e[i] = std::exp((v[i].p - max) * logit_scale);
    for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<float>(e[i] / sum);
    return p;
  };
  // At temperature 1 for top-p and min-p, as llama.cpp's default chain does.
  std::vector<float> p = softmax(c, 1.0f);
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    size_t n = 0;
    while (n < c.size()) {
      cum += p[n++];
      if (cum >= params_.top_p) break;
    }
    c.resize(n);
    p.resize(n);
  }
  if (params_.min_p > 0.0f) {
    const float floor = p.front() * params_.min_p;
    size_t n = 1;
    while (n < c.size() && p[n] >= floor) ++n;
    c.resize(n);
  }
  // Finite: temperature is at least kGreedyTemperature here.
  p = softmax(c, 1.0f / params_.temperature);
  for (size_t i = 0; i < c.size(); ++i) c[i].p = p[i];
  return c;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (logits.empty()) fail("sample: empty logits");
  const std::vector<TokenProb> c = candidates(logits, history);
  if (c.size() == 1) return c.front().id;
  const double u = rng_.uniform();
  double cum = 0.0;
  // When rounding leaves the sum just below u, the last candidate that can be drawn at all,
  // never one of probability 0.
  int32_t last = c.front().id;
  for (const TokenProb& t : c) {
    if (!(t.p > 0.0f)) continue;
    last = t.id;
    cum += t.p;
    if (u < cum) return t.id;
  }
  return last;
}

}  // namespace kvc::model
