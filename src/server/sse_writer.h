// Writes a generation as server-sent events: a chunk per token (through the shared
// ChoiceAccumulator), a finish chunk per choice, an error event for a failed choice, the usage
// chunk when asked for, then "data: [DONE]"; an SSE comment every few seconds while nothing
// is ready finds out whether the client is still there.
//
// Thread-safety: none; one writer belongs to the connection thread streaming its response.
#pragma once

#include <httplib.h>

#include <chrono>
#include <memory>
#include <string>

#include "server/choice_accumulator.h"

namespace kvc::server {

class SseWriter {
 public:
  explicit SseWriter(std::shared_ptr<ChoiceAccumulator> acc);

  // Writes whatever is ready (waiting briefly for it); false once the client is gone, in
  // which case the generation is cancelled.
  bool step(httplib::DataSink& sink);

 private:
  nlohmann::json chunk(nlohmann::json choice) const;
  nlohmann::json chunk_header() const;

  std::shared_ptr<ChoiceAccumulator> acc_;
  bool started_ = false;
  std::chrono::steady_clock::time_point last_write_;
};

}  // namespace kvc::server
