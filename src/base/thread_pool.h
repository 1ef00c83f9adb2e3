// A fixed pool of worker threads that run one parallel region at a time.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

namespace kvc {

class ThreadPool {
 public:
  // n_threads counts the calling thread: a pool of 1 runs everything inline.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(thread_index) once on every thread (the caller is index 0); returns when all finish.
  void run(const std::function<void(int)>& fn);

  // Splits [0, n) into contiguous ranges, one per thread in index order (as many as n / grain
  // allows, at most size()), and runs fn(begin, end) on each in parallel; one runs inline on the
  // caller. How many ranges depends only on n, grain and size(); where they meet follows each
  // thread's measured speed (see shares()), so fn must give an index the same result whatever
  // range holds it. equal_items says that the items cost about the same, so that the region's
  // timings can teach the shares (a region of unequal items uses them without teaching).
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain = 1,
                    bool equal_items = true);

  // Each thread's share of a parallel_for's items, summing to 1: equal at first, then moved
  // toward the threads' item rates in recent regions, so that a core slowed by a busy sibling
  // (a shared host) or a slower core type does not hold every region's end for the others.
  std::vector<double> shares() const { return share_; }

  // Makes every pool's parallel_for split evenly, learning nothing (false), instead of by the
  // learned shares (true, the default): the same values; kept for side-by-side benchmarks.
  static void set_learned_splits(bool learned);

 private:
  // Where one thread records the range it ran and how long it took, a cache line each.
  struct alignas(64) RangeTiming {
    size_t items = 0;
    double seconds = 0.0;
  };

  void worker_loop(int index);
  // Moves share_ toward the item rates timing_ recorded in the last region, one range a thread.
  void learn_shares();

  int n_threads_;
  std::vector<double> share_;
  std::vector<RangeTiming> timing_;
  std::vector<size_t> bounds_;  // the last region's ranges: thread i ran [bounds_[i], bounds_[i+1])
  size_t learned_ = 0;          // regions whose timings moved share_
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace kvc
