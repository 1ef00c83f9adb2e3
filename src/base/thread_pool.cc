#include "base/thread_pool.h"

#include <algorithm>

#include "base/error.h"

namespace kvc {

namespace {
// A decode step issues hundreds of short parallel regions, and a futex wake-up per region
// would cost more than the work, so waiters first spin briefly, then yield the core (so that
// on an oversubscribed machine the thread being waited for can run), then sleep.
constexpr int kSpinPolls = 1 << 12;
constexpr int kYieldPolls = 1 << 8;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls load() until it differs from `from`, spinning then yielding; returns the last value
// read (equal to `from` when the caller should block).
template <typename Load, typename T>
T poll_while_equal(const Load& load, T from) {
  T v = load();
  for (int i = 0; v == from && i < kSpinPolls; ++i) {
    cpu_relax();
    v = load();
  }
  for (int i = 0; v == from && i < kYieldPolls; ++i) {
    std::this_thread::yield();
    v = load();
  }
  return v;
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  if (n_threads < 1) fail("thread count must be at least 1, got {}", n_threads);
  workers_.reserve(n_threads - 1);
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g =
        poll_while_equal([&] { return generation_.load(std::memory_order_acquire); }, seen);
    while (g == seen) {
      generation_.wait(seen);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    (*job_)(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_all();
  }
}

void ThreadPool::run(const std::function<void(int)>& fn) {
  if (n_threads_ == 1) {
    fn(0);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  fn(0);
  int left = pending_.load(std::memory_order_acquire);
  while (left != 0) {
    left = poll_while_equal([&] { return pending_.load(std::memory_order_acquire); }, left);
    if (left == 0) break;
    pending_.wait(left);
    left = pending_.load(std::memory_order_acquire);
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn,
                              size_t grain) {
  // Waking a thread costs microseconds, so small jobs stay on fewer threads.
  const size_t parts = std::clamp<size_t>(n / std::max<size_t>(grain, 1), 1, n_threads_);
  if (parts == 1 || n <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  run([&](int index) {
    const size_t i = static_cast<size_t>(index);
    if (i >= parts) return;
    const size_t begin = n * i / parts;
    const size_t end = n * (i + 1) / parts;
    if (begin < end) fn(begin, end);
  });
}

}  // namespace kvc
