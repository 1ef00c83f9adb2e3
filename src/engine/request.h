// A generation request, the stream a caller reads its tokens from, and its final statistics.
//
// Thread-safety: Request and RequestStats are plain values. RequestHandle is thread-safe: the
// engine thread pushes events while any one reader thread reads them and any thread cancels.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/mutex.h"
#include "kv/content_hash.h"
#include "kv/prefix_index.h"
#include "model/sampler.h"

namespace kvc::engine {

struct Request {
  std::vector<int32_t> prompt;  // token ids, non-empty
  model::SamplingParams sampling;
  int max_tokens = 128;
  std::vector<std::string> stop;  // stop strings, matched across token boundaries
  // Token ids that end the request as a stop string does, unshown (a chat template's
  // end-of-turn token, which is not the vocabulary's EOS and decodes to no text).
  std::vector<int32_t> stop_tokens;
  bool ignore_eos = false;
  int priority = 0;            // higher runs first and is preempted last
  kv::Hash256 ns{};            // cache namespace (model, dtype, block size, tenant, adapter)
  std::string session_id;      // optional: keeps the conversation's blocks between turns
  bool record_logits = false;  // attach each step's logits to its event (tests)
};

enum class RequestErrorKind { kInvalid, kTooLarge, kOverloaded, kShutdown };

// Why the engine refused a request; the message says what to change.
class RequestError : public Error {
 public:
  RequestError(RequestErrorKind kind, const std::string& message) : Error(message), kind_(kind) {}
  RequestErrorKind kind() const { return kind_; }

 private:
  RequestErrorKind kind_;
};

// Why a request ended.
enum class FinishReason : uint8_t {
  kNone,       // not finished yet
  kLength,     // max_tokens generated
  kEos,        // the model produced an end-of-generation token
  kStop,       // a stop string or stop token
  kContext,    // the context window is full
  kCancelled,  // the caller cancelled (or the engine shut down)
  kError,      // the engine failed the request (see RequestHandle::error())
};

// "length", "eos", "stop", "context", "cancelled", "error" ("" for kNone).
const char* finish_reason_name(FinishReason reason);

struct RequestStats {
  size_t prompt_tokens = 0;
  size_t cached_tokens = 0;  // at the first admission
  size_t disk_tokens = 0;    // of those, tokens whose blocks were loaded from the disk tier
  size_t redis_tokens = 0;   // and from the Redis tier
  // Why blocks stored in a tier were recomputed instead of loaded (empty when none were).
  std::string tier_note;
  size_t generated_tokens = 0;
  kv::MissReason miss;
  int preemptions = 0;
  double queue_ms = 0;    // submission to first admission
  double ttft_ms = 0;     // submission to first token
  double tpot_ms = 0;     // mean time per output token after the first
  double prefill_ms = 0;  // last admission to first token
  double decode_ms = 0;   // first token to last token
  double e2e_ms = 0;
  size_t kv_blocks = 0;  // blocks the sequence held at its end (shared and open-key ones included)
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_string;  // the stop string that ended it, if any
};

struct TokenEvent {
  int32_t token = -1;         // -1: text only (the held-back tail at the end)
  std::string text;           // text safe to show: never part of a stop string or of a character
  std::vector<float> logits;  // with Request::record_logits
};

// The caller's side of a request: a stream of events, then final statistics.
class RequestHandle {
 public:
  explicit RequestHandle(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }

  // Waits for the next event; false once the request has finished and every event was read.
  bool next(TokenEvent& event);
  // Like next(), giving up after timeout (returns false with timed_out set).
  bool next_for(TokenEvent& event, std::chrono::milliseconds timeout, bool& timed_out);
  // Asks the engine to stop the request; it takes effect within one engine step.
  void cancel();
  bool cancel_requested() const { return cancelled_.load(); }
  bool finished() const;
  // Final statistics (meaningful once finished).
  RequestStats stats() const;
  // Non-empty when the engine failed the request.
  std::string error() const;
  // Waits for the end and returns every event's text concatenated.
  std::string wait_text();

  // Engine side: called on cancel() so that a sleeping engine notices it.
  void set_on_cancel(std::function<void()> on_cancel);
  void push(TokenEvent event);
  void finish(const RequestStats& stats, std::string error = {});

 private:
  const uint64_t id_;
  std::atomic<bool> cancelled_{false};
  mutable Mutex mu_;
  std::function<void()> on_cancel_ GUARDED_BY(mu_);
  CondVar cv_;
  std::deque<TokenEvent> events_ GUARDED_BY(mu_);
  bool done_ GUARDED_BY(mu_) = false;
  RequestStats stats_ GUARDED_BY(mu_);
  std::string error_ GUARDED_BY(mu_);
};

}  // namespace kvc::engine
