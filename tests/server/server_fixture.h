// A kvcache HTTP server on a free loopback port, started in-process over a loaded model (or,
// in the tokenizer-only mode, over a vocabulary-only GGUF), and
// the client-side helpers the server tests share: JSON requests, SSE streams read as they
// arrive, and a Prometheus text-format parser.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "model/gguf.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"
#include "server/chat_template.h"
#include "server/http_server.h"
#include "test_models.h"

namespace kvc::server::testing {

using nlohmann::json;

struct TestServer {
  std::unique_ptr<model::LlamaModel> model;  // null in the tokenizer-only mode
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::unique_ptr<engine::Engine> engine;  // null in the tokenizer-only mode
  std::unique_ptr<HttpServer> http;
  int port = 0;

  // Loads path, starts an engine and a server on a free port; ready unless ready is false.
  explicit TestServer(const std::string& path, engine::EngineOptions eo = default_engine(),
                      ServerOptions so = {}, bool ready = true) {
    model = model::LlamaModel::load(path);
    tokenizer = std::make_unique<model::Tokenizer>(model::Tokenizer::from_gguf(model->file()));
    engine = std::make_unique<engine::Engine>(*model, *tokenizer, eo);
    so.port = 0;
    http = std::make_unique<HttpServer>(so);
    port = http->start();
    if (ready) make_ready();
  }
  // A ready server in the tokenizer-only mode over the vocabulary-only GGUF at path, with the
  // file's own chat template (else chatml) as `kvcache serve` picks it, the file's stem as the
  // model id, and context_length as max_model_len.
  static std::unique_ptr<TestServer> tokenizer_only(const std::string& path, int context_length) {
    std::unique_ptr<TestServer> s(new TestServer());
    const auto file = gguf::File::open(path);
    s->tokenizer = std::make_unique<model::Tokenizer>(model::Tokenizer::from_gguf(*file));
    Backend b = Backend::tokenizer_only(*s->tokenizer, context_length);
    std::string note;
    bool warning = false;
    b.chat_template = ChatTemplate::for_model(*file, ChatTemplateFlags{}, note, warning);
    b.model_id = std::filesystem::path(path).stem().string();
    ServerOptions so;
    so.port = 0;
    s->http = std::make_unique<HttpServer>(so);
    s->port = s->http->start();
    s->http->set_ready(b);
    return s;
  }

  ~TestServer() {
    if (http) http->shutdown(0);
    http.reset();
    engine.reset();
  }

  void make_ready() {
    Backend b = Backend::generating(*engine);
    b.model_id = "test-model";
    http->set_ready(b);
  }

  static engine::EngineOptions default_engine() {
    engine::EngineOptions eo;
    eo.threads = 1;
    return eo;
  }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(std::chrono::seconds(5));
    c.set_read_timeout(std::chrono::seconds(30));
    c.set_write_timeout(std::chrono::seconds(10));
    return c;
  }

 private:
  TestServer() = default;  // for tokenizer_only()
};

struct Reply {
  int status = -1;  // -1: no response (connection failed)
  json body;
  std::string text;
  httplib::Headers headers;
  std::string header(const std::string& k) const {
    auto it = headers.find(k);
    return it == headers.end() ? "" : it->second;
  }
};

// Seconds of the steady clock since t.
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The tiny synthetic model the server tests run on.
inline std::string tiny_model() {
  return kvc::testing::synthetic_model_path("tiny", DType::F32);
}

// n token ids of the tiny vocabulary, BOS first, varied by seed.
inline std::vector<int32_t> ids(size_t n, int seed) {
  std::vector<int32_t> p = {1};
  for (size_t i = 1; i < n; ++i) p.push_back(3 + static_cast<int32_t>((i * 7 + seed * 13) % 500));
  return p;
}

inline Reply to_reply(const httplib::Result& r) {
  Reply out;
  if (!r) return out;
  out.status = r->status;
  out.text = r->body;
  out.headers = r->headers;
  out.body = json::parse(r->body, nullptr, false);
  return out;
}

inline httplib::Headers auth(const std::string& key) {
  if (key.empty()) return {};
  return {{"Authorization", "Bearer " + key}};
}

inline Reply post(const TestServer& s, const std::string& path, const std::string& body,
                  const std::string& key = "") {
  auto c = s.client();
  return to_reply(c.Post(path.c_str(), auth(key), body, "application/json"));
}

inline Reply post(const TestServer& s, const std::string& path, const json& body,
                  const std::string& key = "") {
  return post(s, path, body.dump(), key);
}

inline Reply get(const TestServer& s, const std::string& path, const std::string& key = "") {
  auto c = s.client();
  return to_reply(c.Get(path.c_str(), auth(key)));
}

// A server-sent event stream as a client reads it, chunk by chunk.
struct SseResult {
  int status = -1;
  httplib::Headers headers;
  std::string raw;                  // every byte received
  std::vector<json> events;         // each "data: " payload but the last, parsed
  bool done = false;                // the stream ended with "data: [DONE]"
  std::vector<std::string> errors;  // framing problems
};

// Splits the complete events out of buffer into result (keeping a trailing partial event).
inline void parse_sse(std::string& buffer, SseResult& r) {
  for (size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
    const std::string event = buffer.substr(0, end);
    buffer.erase(0, end + 2);
    if (event.rfind(":", 0) == 0) continue;  // an SSE comment (keep-alive)
    if (event.rfind("data: ", 0) != 0) {
      r.errors.push_back("event without 'data: ': " + event);
      continue;
    }
    const std::string payload = event.substr(6);
    if (r.done) r.errors.push_back("event after [DONE]: " + payload);
    if (payload == "[DONE]") {
      r.done = true;
      continue;
    }
    json j = json::parse(payload, nullptr, false);
    if (j.is_discarded()) {
      r.errors.push_back("not JSON: " + payload);
      continue;
    }
    r.events.push_back(std::move(j));
  }
}

// POSTs body to path and reads the SSE response as it streams. on_event, when given, sees
// each parsed event and may return false to hang up (the client disconnects mid-stream).
inline SseResult stream(const TestServer& s, const std::string& path, const json& body,
                        const std::string& key = "",
                        std::function<bool(const json&)> on_event = nullptr) {
  SseResult r;
  std::string buffer;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = auth(key);
  req.headers.emplace("Content-Type", "application/json");
  req.body = body.dump();
  req.response_handler = [&](const httplib::Response& res) {
    r.status = res.status;
    r.headers = res.headers;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    r.raw.append(data, n);
    buffer.append(data, n);
    const size_t before = r.events.size();
    parse_sse(buffer, r);
    if (on_event) {
      for (size_t i = before; i < r.events.size(); ++i) {
        if (!on_event(r.events[i])) return false;
      }
    }
    return true;
  };
  auto c = s.client();
  auto res = c.send(req);
  if (res && r.status < 0) r.status = res->status;
  return r;
}

// Waits up to timeout for pred to hold, polling.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// The Prometheus text exposition format 0.0.4, parsed strictly enough to catch what a
// scraper would reject.
struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
struct PromFamily {
  std::string type, help;
  std::vector<PromSample> samples;
};

namespace detail {

inline bool name_start(char c, bool colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}
inline bool name_char(char c, bool colon) {
  return name_start(c, colon) || (c >= '0' && c <= '9');
}

// Parses `name{label="value",...} value` into s; false when the line is malformed. Written out
// rather than with std::regex, whose code trips false maybe-uninitialized warnings in GCC 12
// under the sanitizers.
inline bool parse_sample_line(const std::string& line, PromSample& s) {
  size_t i = 0;
  if (i >= line.size() || !name_start(line[i], true)) return false;
  while (i < line.size() && name_char(line[i], true)) ++i;
  s.name = line.substr(0, i);
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const size_t k = i;
      if (!name_start(line[i], false)) return false;
      while (i < line.size() && name_char(line[i], false)) ++i;
      const std::string key = line.substr(k, i - k);
      if (line.compare(i, 2, "=\"") != 0) return false;
      i += 2;
      std::string value;
      for (; i < line.size() && line[i] != '"'; ++i) {
        if (line[i] == '\\') {
          if (i + 1 >= line.size()) return false;
          value += line[i];
          ++i;
        }
        value += line[i];
      }
      if (i >= line.size()) return false;
      ++i;  // the closing quote
      s.labels[key] = value;
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return false;
    ++i;  // '}'
  }
  if (i >= line.size() || line[i] != ' ') return false;
  const std::string v = line.substr(i + 1);
  if (v.empty() || v.find(' ') != std::string::npos) return false;
  if (v == "+Inf") {
    s.value = INFINITY;
  } else if (v == "-Inf") {
    s.value = -INFINITY;
  } else if (v == "NaN") {
    s.value = NAN;
  } else {
    size_t used = 0;
    try {
      s.value = std::stod(v, &used);
    } catch (...) {
      return false;
    }
    if (used != v.size()) return false;
  }
  return true;
}

}  // namespace detail

// Parses text into families; every problem found is appended to errors.
inline std::map<std::string, PromFamily> parse_prometheus(const std::string& text,
                                                          std::vector<std::string>& errors) {
  std::map<std::string, PromFamily> families;
  std::istringstream in(text);
  std::string line;
  std::string current;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      const bool help = line[2] == 'H';
      const std::string rest = line.substr(7);
      const size_t sp = rest.find(' ');
      if (sp == std::string::npos) {
        errors.push_back("bad comment: " + line);
        continue;
      }
      const std::string name = rest.substr(0, sp);
      if (help) {
        families[name].help = rest.substr(sp + 1);
      } else {
        const std::string type = rest.substr(sp + 1);
        if (type != "counter" && type != "gauge" && type != "histogram" && type != "summary" &&
            type != "untyped") {
          errors.push_back("bad type: " + line);
        }
        if (!families[name].type.empty()) errors.push_back("second TYPE for " + name);
        families[name].type = type;
      }
      current = name;
      continue;
    }
    if (line[0] == '#') continue;
    PromSample s;
    if (!detail::parse_sample_line(line, s)) {
      errors.push_back("bad sample line: " + line);
      continue;
    }
    // A sample belongs to the family announced last; histogram samples add a suffix.
    std::string family = s.name;
    auto fit = families.find(current);
    if (fit != families.end() && fit->second.type == "histogram") {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        const std::string f = current + suffix;
        if (s.name == f) family = current;
      }
    }
    if (family != current) {
      errors.push_back("sample " + s.name + " outside its family (after " + current + ")");
    }
    families[family].samples.push_back(std::move(s));
  }
  for (const auto& [name, f] : families) {
    if (f.help.empty()) errors.push_back(name + " has no HELP");
    if (f.type.empty()) errors.push_back(name + " has no TYPE");
    if (f.type == "counter" && name.size() > 6 && name.substr(name.size() - 6) != "_total") {
      errors.push_back("counter " + name + " does not end in _total");
    }
    if (f.type != "histogram") continue;
    double last_le = -INFINITY, last_count = 0, count = -1;
    bool inf = false;
    for (const auto& s : f.samples) {
      if (s.name == name + "_count") count = s.value;
      if (s.name != name + "_bucket") continue;
      if (!s.labels.count("le")) {
        errors.push_back(name + " bucket without le");
        continue;
      }
      const std::string le = s.labels.at("le");
      const double bound = le == "+Inf" ? INFINITY : std::stod(le);
      if (!(bound > last_le)) errors.push_back(name + " buckets not increasing at le=" + le);
      if (s.value < last_count) errors.push_back(name + " buckets not cumulative at le=" + le);
      last_le = bound;
      last_count = s.value;
      inf = le == "+Inf";
    }
    if (!inf) errors.push_back(name + " does not end with le=\"+Inf\"");
    if (last_count != count) errors.push_back(name + ": +Inf bucket != _count");
  }
  return families;
}

// The value of the sample name{labels}, or NaN when absent.
inline double prom_value(const std::map<std::string, PromFamily>& families, const std::string& name,
                         const std::map<std::string, std::string>& labels = {}) {
  for (const auto& [fname, f] : families) {
    for (const auto& s : f.samples) {
      if (s.name != name) continue;
      bool match = true;
      for (const auto& [k, v] : labels) {
        auto it = s.labels.find(k);
        if (it == s.labels.end() || it->second != v) match = false;
      }
      if (match) return s.value;
    }
  }
  return NAN;
}

}  // namespace kvc::server::testing
