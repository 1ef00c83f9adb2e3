// A fixed-bucket histogram with Prometheus semantics (cumulative buckets, sum, count) and
// quantile estimates, safe to update from one thread while others read snapshots.
#pragma once

#include <cstdint>
#include <vector>

#include "base/mutex.h"

namespace kvc {

class Histogram {
 public:
  // bounds: increasing upper bounds of the buckets; an implicit +Inf bucket follows.
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

  // Latency buckets in milliseconds from 1 ms to about 100 s.
  static std::vector<double> latency_ms_bounds();
  // Finer buckets, in milliseconds from 10 us to 1 s, for block loads.
  static std::vector<double> fast_latency_ms_bounds();

 private:
  mutable Mutex mu_;
  const std::vector<double> bounds_;
  std::vector<uint64_t> counts_ GUARDED_BY(mu_);
  double sum_ GUARDED_BY(mu_) = 0;
  uint64_t count_ GUARDED_BY(mu_) = 0;
};

// The q-quantile (0..1) of values, by nearest rank; 0 for an empty list.
double quantile(std::vector<double> values, double q);

}  // namespace kvc
