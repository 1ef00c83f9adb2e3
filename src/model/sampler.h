// Token sampling: greedy, temperature, top-k, top-p, min-p and repetition penalty, with a
// seeded generator so that a fixed seed reproduces the same tokens on any machine.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvc::model {

// Below this temperature sampling is greedy, as in vLLM: 1/temperature would overflow a float
// (and any temperature this low picks the most likely token anyway).
constexpr float kGreedyTemperature = 1e-5f;

struct SamplingParams {
  float temperature = 0.8f;     // below kGreedyTemperature (0 included) means greedy
  int top_k = 40;               // <= 0 disables
  float top_p = 0.95f;          // >= 1 disables
  float min_p = 0.05f;          // <= 0 disables
  float repeat_penalty = 1.0f;  // 1 disables
  int repeat_last_n = 64;       // how many recent tokens the penalty looks at
  uint64_t seed = 0;

  // Throws Error naming the first out-of-range field.
  void validate() const;
};

// xoshiro256**: a small generator with a specified output sequence, unlike std::
// distributions, whose results differ between standard libraries.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();

 private:
  uint64_t s_[4];
};

struct TokenProb {
  int32_t id;
  float p;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Picks the next token from one row of logits; history is the sequence so far (prompt and
  // generated tokens), used by the repetition penalty.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);

  // The candidates after penalties and truncation, sorted by descending probability, with
  // probabilities after temperature (what sample() draws from). A NaN logit is never a
  // candidate unless every logit is NaN; infinite logits (a model's, or a penalty's overflow)
  // share all the probability equally; the probabilities are never NaN.
  std::vector<TokenProb> candidates(std::span<const float> logits,
                                    std::span<const int32_t> history) const;

 private:
  SamplingParams params_;
  Rng rng_;
};

// The highest logit's index; ties go to the lowest id, and a NaN is never the highest (0 when
// every logit is NaN).
int32_t argmax(std::span<const float> logits);

}  // namespace kvc::model
