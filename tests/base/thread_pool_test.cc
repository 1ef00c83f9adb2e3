#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "base/error.h"

namespace kvc {
namespace {

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (size_t n : {0u, 1u, 2u, 7u, 1000u}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) hits[i]++;
      });
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << threads << " " << n;
    }
  }
}

TEST(ThreadPool, GrainLimitsTheNumberOfRanges) {
  ThreadPool pool(4);
  for (size_t grain : {1u, 3u, 10u, 100u}) {
    std::vector<std::atomic<int>> hits(25);
    std::atomic<int> ranges{0};
    pool.parallel_for(
        hits.size(),
        [&](size_t b, size_t e) {
          ++ranges;
          for (size_t i = b; i < e; ++i) hits[i]++;
        },
        grain);
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    EXPECT_EQ(ranges.load(), static_cast<int>(std::clamp<size_t>(25 / grain, 1, 4))) << grain;
  }
}

TEST(ThreadPool, RunsManyRegionsBackToBack) {
  ThreadPool pool(2);
  std::atomic<long> sum{0};
  for (int rep = 0; rep < 20000; ++rep) {
    pool.run([&](int index) { sum += index + 1; });
  }
  EXPECT_EQ(sum.load(), 20000L * 3);
}

TEST(ThreadPool, RejectsZeroThreads) {
  EXPECT_THROW(ThreadPool(0), Error);
}

}  // namespace
}  // namespace kvc
