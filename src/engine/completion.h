// Running one request through the engine to its end: what `kvcache run`, the benchmarks and
// tests use, so that every generation takes the engine's one path.
//
// Thread-safety: complete() may be called from any thread but the engine's own.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/request.h"

namespace kvc::engine {

struct Completion {
  std::vector<int32_t> tokens;             // generated token ids
  std::string text;                        // the events' text, concatenated
  std::vector<std::vector<float>> logits;  // each step's logits (with Request::record_logits)
  RequestStats stats;
  std::string error;  // non-empty when the engine failed the request
};

// Reads a submitted request's events to its end, calling on_event for each as it arrives.
Completion collect(RequestHandle& handle,
                   const std::function<void(const TokenEvent&)>& on_event = {});

// Submits request, calls on_event for each event as it arrives, and returns at its end.
// Throws RequestError when the engine refuses the request.
Completion complete(Engine& engine, Request request,
                    const std::function<void(const TokenEvent&)>& on_event = {});

}  // namespace kvc::engine
