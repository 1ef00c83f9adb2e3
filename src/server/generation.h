// The engine requests behind one API call, one per choice (each prompt times n samples), read
// as one stream of per-choice events.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "server/api_error.h"

namespace kvc::server {

// The API error for a request the engine refused: 429 when overloaded, 400 when invalid or
// too large for the pool, 503 when shutting down.
ApiError api_error_for(const engine::RequestError& e);

class Generation {
 public:
  // Submits every request in order. If the engine refuses one, cancels those already submitted
  // and throws the matching ApiError.
  Generation(engine::Engine& engine, std::vector<engine::Request> requests);
  // Cancels every request still running: a client that went away frees its blocks.
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  struct Event {
    size_t choice = 0;
    bool finished = false;  // the choice ended: its stats and error are final, token is empty
    engine::TokenEvent token;
  };
  // Waits up to timeout for the next event of any choice, taking choices in turn so that none
  // starves the others. False when it timed out or every choice has ended.
  bool next(Event& event, std::chrono::milliseconds timeout);
  // Whether every choice has ended and its end was returned by next().
  bool done() const;
  // Asks the engine to stop every unfinished request (effective within one step).
  void cancel();

  // The number of choices, and each one's request (its stats and error once it ended).
  size_t size() const { return handles_.size(); }
  const engine::RequestHandle& handle(size_t choice) const { return *handles_[choice]; }

 private:
  std::vector<std::shared_ptr<engine::RequestHandle>> handles_;
  std::vector<bool> ended_;
  size_t cursor_ = 0;
};

}  // namespace kvc::server
