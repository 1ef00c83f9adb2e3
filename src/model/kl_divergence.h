// Comparing a run's token distributions with a reference run's: the reference's
// log-probabilities are saved to a file (`kvcache perplexity --kl-divergence-base FILE`), and a
// later run over the same tokens is scored against them (`--kl-divergence`).
//
// File format (little-endian): the 8 bytes "KVCKLD1\n", u32 vocabulary size, u32 context,
// u64 scored tokens (patched when the file is finished); then per scored token, in order,
// i32 the token that follows and the vocabulary's log-probabilities as f32. A token takes
// 4 + 4 * n_vocab bytes (2,052 B for stories260K, 128,004 B for a 32,000-token vocabulary).
//
// Thread-safety: each object is used by one thread at a time.
#pragma once

#include <cstdint>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace kvc::model {

class LogProbWriter {
 public:
  // Creates path; throws Error naming it when it cannot be written.
  LogProbWriter(const std::string& path, uint32_t n_vocab, uint32_t context);
  // Appends one scored token (log_probs has n_vocab entries).
  void add(std::span<const float> log_probs, int32_t next);
  // Writes the token count into the header and closes; throws Error on a write failure.
  void finish();

 private:
  std::string path_;
  std::ofstream out_;
  uint32_t n_vocab_;
  uint64_t count_ = 0;
};

struct KlStats {
  uint64_t tokens = 0;
  double mean_kl = 0.0;  // mean KL(base || run), nats
  double p99_kl = 0.0;   // 99th percentile of the per-token KL divergence
  double max_kl = 0.0;
  double top1_agreement = 0.0;  // fraction of tokens whose most likely entry is the same
  double base_ppl = 0.0;        // the reference's perplexity over the same tokens
  double ppl = 0.0;             // this run's
  double ppl_ratio = 0.0;       // ppl / base_ppl
};

// The figures of a run's distributions against a reference's, token by token, in memory.
class KlAccumulator {
 public:
  // Adds one scored token: the reference's and this run's log-probabilities over the same
  // vocabulary, and the token that follows.
  void add(std::span<const float> base, std::span<const float> run, int32_t next);
  // Tokens added so far.
  uint64_t tokens() const { return kl_.size(); }
  // The figures over every token added (all zero when none was).
  KlStats finish() const;

 private:
  std::vector<double> kl_;
  uint64_t agree_ = 0;
  double base_nll_ = 0.0, nll_ = 0.0;
};

// A KlAccumulator fed from a base file written by LogProbWriter.
class KlComparison {
 public:
  // Opens a base file; throws Error naming the file when it is missing, malformed or made for
  // another vocabulary size or context.
  KlComparison(const std::string& path, uint32_t n_vocab, uint32_t context);
  // Compares the next scored token; throws Error when the base file ends early or its token
  // differs (another text or tokenizer).
  void add(std::span<const float> log_probs, int32_t next);
  // The figures; throws Error when the base file holds more tokens than were compared.
  KlStats finish();

 private:
  std::string path_;
  std::ifstream in_;
  uint32_t n_vocab_;
  uint64_t stored_ = 0;
  std::vector<float> base_;
  KlAccumulator stats_;
};

}  // namespace kvc::model
