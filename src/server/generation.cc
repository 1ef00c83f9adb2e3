#include "server/generation.h"

#include "server/api_error.h"

namespace kvc::server {

ApiError api_error_for(const engine::RequestError& e) {
  switch (e.kind()) {
    case engine::RequestErrorKind::kOverloaded:
      return ApiError(429, "rate_limit_error", e.what(), "", "overloaded");
    case engine::RequestErrorKind::kShutdown:
      return ApiError(503, "server_error", e.what(), "", "shutting_down");
    case engine::RequestErrorKind::kTooLarge:
      return ApiError(400, "invalid_request_error", e.what(), "max_tokens",
                      "context_length_exceeded");
    case engine::RequestErrorKind::kInvalid:
      break;
  }
  return ApiError(400, "invalid_request_error", e.what());
}

Generation::Generation(engine::Engine& engine, std::vector<engine::Request> requests) {
  try {
    handles_ = engine.submit_all(std::move(requests));
  } catch (const engine::RequestError& e) {
    cancel();
    throw api_error_for(e);
  }
  ended_.assign(handles_.size(), false);
}

Generation::~Generation() {
  cancel();
}

void Generation::cancel() {
  for (auto& h : handles_) {
    if (!h->finished()) h->cancel();
  }
}

bool Generation::done() const {
  for (bool e : ended_) {
    if (!e) return false;
  }
  return true;
}

bool Generation::next(Event& event, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const size_t n = handles_.size();
  // With several choices, each wait is short so that events of the others are not held up.
  const auto slice = n == 1 ? timeout : std::chrono::milliseconds(2);
  for (;;) {
    size_t open = n;
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (cursor_ + k) % n;
      if (ended_[i]) {
        --open;
        continue;
      }
      bool timed_out = false;
      if (handles_[i]->next_for(event.token, std::chrono::milliseconds(0), timed_out)) {
        event.choice = i;
        event.finished = false;
        cursor_ = i + 1;
        return true;
      }
      if (!timed_out) {
        ended_[i] = true;
        event = Event{i, true, {}};
        cursor_ = i + 1;
        return true;
      }
    }
    if (open == 0) return false;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    size_t first = 0;
    while (ended_[first]) ++first;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    bool timed_out = false;
    if (handles_[first]->next_for(event.token, std::min(slice, left), timed_out)) {
      event.choice = first;
      event.finished = false;
      cursor_ = first + 1;
      return true;
    }
    if (!timed_out) {
      ended_[first] = true;
      event = Event{first, true, {}};
      cursor_ = first + 1;
      return true;
    }
  }
}

}  // namespace kvc::server
