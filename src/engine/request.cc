#include "engine/request.h"

namespace kvc::engine {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kContext:
      return "context";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

void RequestHandle::cancel() {
  cancelled_.store(true);
  std::function<void()> wake;
  {
    MutexLock lock(mu_);
    wake = on_cancel_;
  }
  if (wake) wake();
}

void RequestHandle::set_on_cancel(std::function<void()> on_cancel) {
  MutexLock lock(mu_);
  on_cancel_ = std::move(on_cancel);
}

bool RequestHandle::next(TokenEvent& event) {
  MutexLock lock(mu_);
  while (events_.empty() && !done_) cv_.wait(lock);
  if (events_.empty()) return false;
  event = std::move(events_.front());
  events_.pop_front();
  return true;
}

bool RequestHandle::next_for(TokenEvent& event, std::chrono::milliseconds timeout,
                             bool& timed_out) {
  MutexLock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (events_.empty() && !done_) {
    if (!cv_.wait_until(lock, deadline)) break;
  }
  timed_out = events_.empty() && !done_;
  if (timed_out || events_.empty()) return false;
  event = std::move(events_.front());
  events_.pop_front();
  return true;
}

bool RequestHandle::finished() const {
  MutexLock lock(mu_);
  return done_;
}

RequestStats RequestHandle::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

std::string RequestHandle::error() const {
  MutexLock lock(mu_);
  return error_;
}

std::string RequestHandle::wait_text() {
  std::string text;
  TokenEvent e;
  while (next(e)) text += e.text;
  return text;
}

void RequestHandle::push(TokenEvent event) {
  {
    MutexLock lock(mu_);
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

void RequestHandle::finish(const RequestStats& stats, std::string error) {
  {
    MutexLock lock(mu_);
    stats_ = stats;
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
}

}  // namespace kvc::engine
