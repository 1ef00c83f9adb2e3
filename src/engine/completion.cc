#include "engine/completion.h"

namespace kvc::engine {

Completion complete(Engine& engine, Request request,
                    const std::function<void(const TokenEvent&)>& on_event) {
  return collect(*engine.submit(std::move(request)), on_event);
}

Completion collect(RequestHandle& handle, const std::function<void(const TokenEvent&)>& on_event) {
  Completion c;
  TokenEvent e;
  while (handle.next(e)) {
    if (on_event) on_event(e);
    if (e.token >= 0) c.tokens.push_back(e.token);
    c.text += e.text;
    if (!e.logits.empty()) c.logits.push_back(std::move(e.logits));
  }
  c.stats = handle.stats();
  c.error = handle.error();
  return c;
}

}  // namespace kvc::engine
