#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
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

// Busy for `per_item` times n on the calling thread's clock (a sleep would hand the core back).
void spin_for(std::chrono::microseconds per_item, size_t n) {
  const auto until = std::chrono::steady_clock::now() + per_item * n;
  while (std::chrono::steady_clock::now() < until) {
  }
}

TEST(ThreadPool, ParallelForGivesASlowerThreadFewerItems) {
  ThreadPool pool(2);
  EXPECT_EQ(pool.shares(), (std::vector<double>{0.5, 0.5}));
  // The caller (thread 0, the first range) takes eight times as long per item as the worker.
  const std::thread::id caller = std::this_thread::get_id();
  size_t first_range = 0;
  for (int region = 0; region < 30; ++region) {
    std::vector<std::atomic<int>> hits(64);
    pool.parallel_for(hits.size(), [&](size_t b, size_t e) {
      const bool slow = std::this_thread::get_id() == caller;
      if (slow) first_range = e - b;
      spin_for(std::chrono::microseconds(slow ? 40 : 5), e - b);
      for (size_t i = b; i < e; ++i) hits[i]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1) << region;
  }
  const std::vector<double> shares = pool.shares();
  EXPECT_NEAR(shares[0] + shares[1], 1.0, 1e-12);
  // The caller's rate is a ninth of the two; its share stops near the floor, an eighth.
  EXPECT_LT(shares[0], 0.3);
  EXPECT_GT(shares[0], 0.1);
  EXPECT_LT(first_range, 64u * 3 / 10);
  EXPECT_GE(first_range, 1u);
}

TEST(ThreadPool, RegionsOfUnequalItemsTeachNoShares) {
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  for (int region = 0; region < 10; ++region) {
    pool.parallel_for(
        64,
        [&](size_t b, size_t e) {
          spin_for(std::chrono::microseconds(std::this_thread::get_id() == caller ? 40 : 5), e - b);
        },
        1, /*equal_items=*/false);
  }
  EXPECT_EQ(pool.shares(), (std::vector<double>{0.5, 0.5}));
}

TEST(ThreadPool, RangesStayWholeWhateverTheShares) {
  ThreadPool pool(3);
  // Teach the pool that thread 0 is slow, then split amounts from 3 items up: every index once,
  // one range a thread, none empty.
  const std::thread::id caller = std::this_thread::get_id();
  for (int region = 0; region < 20; ++region) {
    pool.parallel_for(30, [&](size_t b, size_t e) {
      spin_for(std::chrono::microseconds(std::this_thread::get_id() == caller ? 50 : 5), e - b);
    });
  }
  for (size_t n = 3; n < 40; ++n) {
    std::vector<std::atomic<int>> hits(n);
    std::atomic<int> ranges{0};
    pool.parallel_for(n, [&](size_t b, size_t e) {
      EXPECT_LT(b, e);
      ++ranges;
      for (size_t i = b; i < e; ++i) hits[i]++;
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1) << n;
    EXPECT_EQ(ranges.load(), 3) << n;
  }
}

TEST(ThreadPool, RejectsZeroThreads) {
  EXPECT_THROW(ThreadPool(0), Error);
}

}  // namespace
}  // namespace kvc
