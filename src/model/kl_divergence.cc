#include "model/kl_divergence.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"

namespace kvc::model {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'C', 'K', 'L', 'D', '1', '\n'};
constexpr std::streamoff kCountAt = 16;

template <class T>
void put(std::ofstream& out, T v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof v);
}

template <class T>
bool get(std::ifstream& in, T& v) {
  return static_cast<bool>(in.read(reinterpret_cast<char*>(&v), sizeof v));
}

size_t argmax(std::span<const float> v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

LogProbWriter::LogProbWriter(const std::string& path, uint32_t n_vocab, uint32_t context)
    : path_(path), out_(path, std::ios::binary | std::ios::trunc), n_vocab_(n_vocab) {
  if (!out_) fail("--kl-divergence-base {}: cannot be written", path);
  out_.write(kMagic, sizeof kMagic);
  put(out_, n_vocab);
  put(out_, context);
  put(out_, uint64_t{0});
}

void LogProbWriter::add(std::span<const float> log_probs, int32_t next) {
  put(out_, next);
  out_.write(reinterpret_cast<const char*>(log_probs.data()),
             static_cast<std::streamsize>(n_vocab_ * sizeof(float)));
  ++count_;
}

void LogProbWriter::finish() {
  out_.seekp(kCountAt);
  put(out_, count_);
  out_.close();
  if (!out_) fail("--kl-divergence-base {}: write failed", path_);
}

KlComparison::KlComparison(const std::string& path, uint32_t n_vocab, uint32_t context)
    : path_(path), in_(path, std::ios::binary), n_vocab_(n_vocab), base_(n_vocab) {
  if (!in_) fail("--kl-divergence-base {}: cannot be read", path);
  char magic[8];
  uint32_t vocab = 0, ctx = 0;
  if (!in_.read(magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof magic) != 0 ||
      !get(in_, vocab) || !get(in_, ctx) || !get(in_, stored_)) {
    fail("--kl-divergence-base {}: not a kvcache log-probability file", path);
  }
  if (vocab != n_vocab) {
    fail("--kl-divergence-base {}: made for a vocabulary of {} tokens, this model has {}", path,
         vocab, n_vocab);
  }
  if (ctx != context) {
    fail("--kl-divergence-base {}: made with a context (-c) of {}, this run uses {}", path, ctx,
         context);
  }
}

void KlAccumulator::add(std::span<const float> base, std::span<const float> run, int32_t next) {
  double kl = 0.0;
  for (size_t i = 0; i < base.size(); ++i) {
    const double lp = base[i];
    kl += std::exp(lp) * (lp - static_cast<double>(run[i]));
  }
  kl_.push_back(std::max(0.0, kl));
  agree_ += argmax(base) == argmax(run) ? 1 : 0;
  base_nll_ -= base[static_cast<size_t>(next)];
  nll_ -= run[static_cast<size_t>(next)];
}

KlStats KlAccumulator::finish() const {
  KlStats s;
  s.tokens = kl_.size();
  if (kl_.empty()) return s;
  const auto n = static_cast<double>(kl_.size());
  for (double k : kl_) s.mean_kl += k;
  s.mean_kl /= n;
  std::vector<double> sorted = kl_;
  std::sort(sorted.begin(), sorted.end());
  s.p99_kl = sorted[static_cast<size_t>(std::ceil(0.99 * n)) - 1];
  s.max_kl = sorted.back();
  s.top1_agreement = static_cast<double>(agree_) / n;
  s.base_ppl = std::exp(base_nll_ / n);
  s.ppl = std::exp(nll_ / n);
  s.ppl_ratio = s.ppl / s.base_ppl;
  return s;
}

void KlComparison::add(std::span<const float> log_probs, int32_t next) {
  int32_t base_next = 0;
  if (stats_.tokens() >= stored_ || !get(in_, base_next) ||
      !in_.read(reinterpret_cast<char*>(base_.data()),
                static_cast<std::streamsize>(n_vocab_ * sizeof(float)))) {
    fail("--kl-divergence-base {}: holds {} tokens, this run scores more", path_, stored_);
  }
  if (base_next != next) {
    fail("--kl-divergence-base {}: scored token {} is {} there and {} here (another text?)", path_,
         stats_.tokens(), base_next, next);
  }
  stats_.add(base_, log_probs, next);
}

KlStats KlComparison::finish() {
  if (stats_.tokens() != stored_) {
    fail("--kl-divergence-base {}: holds {} tokens, this run scored {}", path_, stored_,
         stats_.tokens());
  }
  return stats_.finish();
}

}  // namespace kvc::model
