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

  // Splits [0, n) into contiguous ranges of at least grain items (at most size() ranges) and
  // runs fn(begin, end) on each, in parallel; one range runs inline on the caller. The split
  // depends only on n, grain and size(), never on timing.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain = 1);

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace kvc
