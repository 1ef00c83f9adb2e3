#include "server/sse_writer.h"

#include "server/http_transport.h"
#include "server/openai_protocol.h"

namespace kvc::server {

namespace {

// How long a stream waits for tokens before it checks on its client with an SSE comment.
constexpr auto kKeepAliveInterval = std::chrono::seconds(2);

}  // namespace

SseWriter::SseWriter(std::shared_ptr<ChoiceAccumulator> acc)
    : acc_(std::move(acc)), last_write_(std::chrono::steady_clock::now()) {}

nlohmann::json SseWriter::chunk_header() const {
  const ResponseShape& shape = acc_->shape();
  nlohmann::json c = {{"id", shape.id},
                      {"object", shape.chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", shape.created},
                      {"model", shape.model}};
  if (shape.include_usage) c["usage"] = nullptr;
  return c;
}

nlohmann::json SseWriter::chunk(nlohmann::json choice) const {
  nlohmann::json c = chunk_header();
  c["choices"] = nlohmann::json::array({std::move(choice)});
  return c;
}

bool SseWriter::step(httplib::DataSink& sink) {
  Generation& gen = acc_->generation();
  // A client that left is found here before a write would find it (a write only fails once
  // the client's reset to the write before it has come back).
  if (HttpTransport::client_gone()) {
    gen.cancel();
    return false;
  }
  std::string out;
  if (!started_) {
    started_ = true;
    if (acc_->shape().chat) {
      for (size_t i = 0; i < gen.size(); ++i) {
        out += sse_data(chunk({{"index", i},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}));
      }
    }
  }
  Generation::Event e;
  bool got = gen.next(e, std::chrono::milliseconds(100));
  while (got) {
    ChoiceAccumulator::Update u = acc_->add(e);
    if (u.failure) {
      out += sse_data(u.failure->to_json());
    } else if (u.choice) {
      nlohmann::json c = chunk(std::move(*u.choice));
      if (!u.kvcache.is_null()) c["kvcache"] = std::move(u.kvcache);
      out += sse_data(c);
    }
    if (out.size() > 16384) break;
    got = gen.next(e, std::chrono::milliseconds(0));
  }
  const bool done = gen.done();
  if (done) {
    if (acc_->shape().include_usage) {
      nlohmann::json last = chunk_header();
      last["choices"] = nlohmann::json::array();
      last["usage"] = acc_->usage();
      last["kvcache"] = acc_->kvcache_summary();
      out += sse_data(last);
    }
    out += "data: [DONE]\n\n";
  }
  const auto now = std::chrono::steady_clock::now();
  if (out.empty()) {
    // Nothing to send yet (queued, or prefilling): a comment line, which SSE clients ignore,
    // finds out whether the client is still there.
    if (now - last_write_ < kKeepAliveInterval) return true;
    out = ": keep-alive\n\n";
  }
  if (!sink.write(out.data(), out.size())) {
    gen.cancel();
    return false;
  }
  last_write_ = now;
  if (done) sink.done();
  return true;
}

}  // namespace kvc::server
