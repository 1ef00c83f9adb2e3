// A mutex, its scoped lock and a condition variable that clang's thread-safety analysis
// understands (std::mutex carries no annotations in libstdc++).
//
// Thread-safety: Mutex and CondVar are meant to be shared between threads; a MutexLock belongs
// to the thread that made it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "base/thread_annotations.h"

namespace kvc {

class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds mu from construction to destruction.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

// Waits release the lock's mutex and hold it again on return, so the caller's analysis still
// sees it held. Callers test their condition in a loop around wait (spurious wake-ups).
class CondVar {
 public:
  void wait(MutexLock& lock) { cv_.wait(lock.lock_); }
  // False when the deadline passed.
  bool wait_until(MutexLock& lock, std::chrono::steady_clock::time_point deadline) {
    return cv_.wait_until(lock.lock_, deadline) == std::cv_status::no_timeout;
  }
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace kvc
