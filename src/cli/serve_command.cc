// `kvcache serve`: the OpenAI-compatible HTTP server over the engine.
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "base/byte_size.h"
#include "base/error.h"
#include "base/kernels.h"
#include "cli/cli_options.h"
#include "cli/commands.h"
#include "cli/engine_start.h"
#include "cli/model_source.h"
#include "cli/startup_log.h"
#include "engine/engine.h"
#include "model/gguf.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"
#include "server/chat_template.h"
#include "server/http_server.h"

namespace kvc::cli {

namespace {

struct ServeArgs {
  TierArgs tiers;
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string kv_memory;
  int block_tokens = 0;
  KvDtypeArgs kv_dtypes;
  std::string api_keys;
  bool no_prefix_cache = false;
  bool mmap = false;
  std::string chat_template;
  std::string chat_template_file;
  int threads = 0;
  int max_batch_tokens = 512;
  int max_running = 16;
  size_t max_waiting = 256;
  std::string max_body = "4MiB";
  double drain_seconds = 30;
  size_t max_session_blocks = 256;
  size_t max_tenant_pinned_blocks = 0;  // 0: a quarter of the pool
  std::vector<std::string> served_model_names;
  server::TransportOptions transport;
};

// The server uses the backend (engine, tokenizer) until it has shut down, so it stops before
// they go, however the scope that holds them ends.
struct StopServerFirst {
  server::HttpServer& http;
  ~StopServerFirst() { http.shutdown(0); }
};

// The names the backend answers to: the file's stem, then --served-model-name.
void name_backend(server::Backend& backend, const std::string& path, const ServeArgs& a) {
  backend.model_id = std::filesystem::path(path).stem().string();
  for (const auto& name : a.served_model_names) {
    if (name.empty()) fail("--served-model-name: a name must not be empty");
    backend.served_model_names.push_back(name);
  }
}

// Waits for SIGINT or SIGTERM (blocked in every thread) and returns it; a second one from
// then on ends the process at once.
int wait_for_stop(const sigset_t& stop_signals) {
  int signal = 0;
  sigwait(&stop_signals, &signal);
  std::thread([stop_signals] {
    int again = 0;
    sigwait(&stop_signals, &again);
    spdlog::warn("{} again: exiting without waiting for the drain", strsignal(again));
    std::_Exit(1);
  }).detach();
  return signal;
}

void log_template(const std::string& note, bool warning) {
  if (warning) {
    spdlog::warn("{}", note);
  } else {
    spdlog::info("{}", note);
  }
}

// The tokenizer-only mode, for a vocabulary-only GGUF (llama.cpp's ggml-vocab-*.gguf:
// metadata and a tokenizer, no weights), so that a tokenizer and chat template can be checked
// alone: no engine, no KV pool.
void serve_tokenizer_only(const ServeArgs& a, server::HttpServer& http, int port,
                          const gguf::File& file, const std::string& path,
                          const sigset_t& stop_signals) {
  const auto tokenizer = model::Tokenizer::from_gguf(file);
  std::string template_note;
  bool template_warning = false;
  const server::ChatTemplate chat_template = server::ChatTemplate::for_model(
      file, {a.chat_template, a.chat_template_file}, template_note, template_warning);
  // max_model_len in /tokenize and /v1/models: the file's context when it names one.
  const std::string arch = file.get_string("general.architecture", "");
  const gguf::Value* ctx = file.find(arch + ".context_length");
  const uint64_t context = ctx && ctx->as_u64() ? *ctx->as_u64() : 0;

  spdlog::info(
      "{} is a vocabulary-only GGUF (architecture '{}', {} tokens, no weight tensors): "
      "tokenizer-only mode, serving /tokenize, /detokenize and /apply-template; generation "
      "and cache endpoints answer 400",
      path, arch, tokenizer.size());
  log_template(template_note, template_warning);

  server::Backend backend = server::Backend::tokenizer_only(
      tokenizer, static_cast<int>(std::min<uint64_t>(context, INT32_MAX)));
  backend.chat_template = chat_template;
  name_backend(backend, path, a);
  http.set_ready(backend);
  StopServerFirst stop_server_first{http};
  spdlog::info("ready: serving {} (tokenizer only) on http://{}:{}", backend.model_id, a.host,
               port);

  const int signal = wait_for_stop(stop_signals);
  spdlog::info("{}: stopping", strsignal(signal));
  http.shutdown(a.drain_seconds);
  spdlog::info("stopped");
}

void serve(const ServeArgs& a) {
  // SIGINT and SIGTERM are taken by sigwait() below, so every thread started from here on
  // must block them; a client that vanishes mid-write must not kill the process.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  const KvDtypes kv_dtypes = resolve_kv_dtypes(a.kv_dtypes, DType::F16, true);
  if (a.port < 0 || a.port > 65535) fail("--port must be 0 to 65535, got {}", a.port);
  if (a.drain_seconds < 0) fail("--drain-seconds must be >= 0, got {}", a.drain_seconds);
  // A bad template name is reported before anything is loaded.
  if (!a.chat_template.empty()) server::ChatTemplate::named(a.chat_template);
  if (!a.chat_template.empty() && !a.chat_template_file.empty()) {
    fail("give --chat-template or --chat-template-file, not both");
  }
  // The queue counts a request from its submission, so 0 would refuse every request.
  if (a.max_waiting < 1) fail("--max-waiting must be >= 1, got {}", a.max_waiting);
  server::ServerOptions options;
  options.host = a.host;
  options.port = a.port;
  options.max_body_bytes = parse_byte_size(a.max_body, "--max-body");
  // Every streaming request holds a connection thread while it runs or waits: room for all
  // the engine runs at once plus a margin for queued streams and /metrics scrapes.
  if (a.transport.header_timeout_s <= 0) fail("--header-timeout must be > 0");
  if (a.transport.body_timeout_s <= 0) fail("--body-timeout must be > 0");
  if (a.transport.max_connections < 1) fail("--max-connections must be >= 1");
  // Every streaming request holds a connection (and its thread) while it runs or waits.
  options.transport = a.transport;
  if (!a.api_keys.empty()) {
    options.api_keys = server::ApiKeys::load(a.api_keys);
    spdlog::info("API keys: {} keys for {} tenants from {}", options.api_keys->size(),
                 options.api_keys->tenant_names().size(), a.api_keys);
  } else {
    spdlog::info(
        "no --api-keys: requests need no key and share one anonymous tenant, which may pin "
        "and flush the cache");
  }

  // Listening before the model loads lets /health answer 503 meanwhile.
  server::HttpServer http(options);
  const int port = http.start();
  spdlog::info("listening on http://{}:{} (/health answers 503 until the model is loaded)", a.host,
               port);

  const std::string path = resolve_model(a.model);
  const std::shared_ptr<const gguf::File> file = gguf::File::open(path, model_residency(a.mmap));
  if (model::is_vocabulary_only(*file)) {
    serve_tokenizer_only(a, http, port, *file, path, stop_signals);
    return;
  }
  const auto model = model::LlamaModel::from_file(file);
  const auto tokenizer = model::Tokenizer::from_gguf(model->file());
  std::string template_note;
  bool template_warning = false;
  const server::ChatTemplate chat_template = server::ChatTemplate::for_model(
      model->file(), {a.chat_template, a.chat_template_file}, template_note, template_warning);

  engine::EngineOptions eo;
  eo.block_tokens = a.block_tokens;
  eo.kv_k_dtype = kv_dtypes.k;
  eo.kv_v_dtype = kv_dtypes.v;
  eo.threads = a.threads;
  eo.max_batch_tokens = a.max_batch_tokens;
  eo.max_running = a.max_running;
  eo.max_waiting = a.max_waiting;
  eo.prefix_cache = !a.no_prefix_cache;
  eo.session_max_blocks = a.max_session_blocks;
  eo.tenant_pinned_max_blocks = a.max_tenant_pinned_blocks;
  if (!a.kv_memory.empty()) eo.kv_memory_bytes = parse_byte_size(a.kv_memory, "--kv-memory");
  apply_tier_options(a.tiers, eo);
  const std::unique_ptr<engine::Engine> engine_holder =
      start_engine(*model, tokenizer, eo, a.kv_memory);
  engine::Engine& engine = *engine_holder;

  log_model_and_pool(path, *model, engine);
  const int threads = thread_count(a.threads);
  spdlog::info("{} threads, {} kernels; prefix cache {}; up to {} running, {} waiting", threads,
               kernels::kernels_name(), eo.prefix_cache ? "on" : "off",
               eo.max_running, eo.max_waiting);
  log_template(template_note, template_warning);
  spdlog::info("sessions keep up to {} blocks each; a tenant's sessions and pins up to {} blocks",
               eo.session_max_blocks, engine.tenant_pinned_max_blocks());
  spdlog::info(
      "connections: up to {} ({} per client address); headers due within {} s, bodies "
      "within {} s",
      a.transport.max_connections, a.transport.max_connections_per_client,
      a.transport.header_timeout_s, a.transport.body_timeout_s);

  server::Backend backend = server::Backend::generating(engine);
  backend.chat_template = chat_template;
  name_backend(backend, path, a);
  http.set_ready(backend);
  StopServerFirst stop_server_first{http};
  spdlog::info("ready: serving {} on http://{}:{}", backend.model_id, a.host, port);

  const int signal = wait_for_stop(stop_signals);
  spdlog::info("{}: no new requests; draining in-flight ones for up to {} s", strsignal(signal),
               a.drain_seconds);
  const server::DrainReport drained = http.shutdown(a.drain_seconds);
  // The engine's "finished" counts cancelled requests too.
  const engine::EngineStats st = engine.stats();
  spdlog::info(
      "stopped: {} requests completed, {} cancelled; the drain took {:.2f} s ({} completed, {} "
      "cancelled)",
      st.finished - st.cancelled, st.cancelled, drained.seconds, drained.completed,
      drained.cancelled);
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve the OpenAI-compatible HTTP API");
  cmd->add_option("-m,--model", args->model, "GGUF model file (default: the tiny demo model)");
  add_mmap_option(*cmd, args->mmap);
  cmd->add_option("--host", args->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", args->port, "Port to listen on (0: any free port)")
      ->capture_default_str();
  add_tier_options(*cmd, args->tiers);
  cmd->add_option("--kv-memory", args->kv_memory,
                  "KV pool size, e.g. 256MiB (default: max-running full contexts, within 2 GiB)");
  cmd->add_option(
         "--block-tokens", args->block_tokens,
         "Tokens per KV block (default 16; 32, the per-channel key group, with quantised keys)")
      ->capture_default_str();
  add_kv_dtype_options(*cmd, args->kv_dtypes, "f16");
  cmd->add_option("--api-keys", args->api_keys,
                  "File of 'KEY TENANT [admin]' lines; requests then need 'Authorization: "
                  "Bearer KEY'");
  cmd->add_flag("--no-prefix-cache", args->no_prefix_cache,
                "Never share cached prefixes (for comparisons)");
  cmd->add_option("--chat-template", args->chat_template,
                  "Chat template: llama-2, chatml, llama-3 or zephyr (default: the model's "
                  "tokenizer.chat_template, else chatml)");
  cmd->add_option("--chat-template-file", args->chat_template_file,
                  "Jinja chat template file to use instead of the model's");
  cmd->add_option("-t,--threads", args->threads, "Compute threads (default: all cores)");
  cmd->add_option("--max-batch-tokens", args->max_batch_tokens,
                  "Tokens per forward pass (decodes and prefill chunks)")
      ->capture_default_str();
  cmd->add_option("--max-running", args->max_running, "Requests generating at once")
      ->capture_default_str();
  cmd->add_option("--max-waiting", args->max_waiting,
                  "Queued requests before new ones get 429 (queued includes just-submitted)")
      ->capture_default_str();
  cmd->add_option("--max-body", args->max_body, "Largest request body; larger ones get 413")
      ->capture_default_str();
  cmd->add_option("--drain-seconds", args->drain_seconds,
                  "On SIGTERM/SIGINT, how long in-flight requests may finish")
      ->capture_default_str();
  cmd->add_option("--max-session-blocks", args->max_session_blocks,
                  "KV blocks one chat session keeps between turns")
      ->capture_default_str();
  cmd->add_option("--max-tenant-pinned-blocks", args->max_tenant_pinned_blocks,
                  "KV blocks one tenant's sessions and pins may hold together (default: a "
                  "quarter of the pool)");
  cmd->add_option("--served-model-name", args->served_model_names,
                  "Names the model answers to besides its file name, as NAME[,NAME...]; "
                  "/v1/models lists them, other names get 404 model_not_found")
      ->delimiter(',');
  cmd->add_option("--header-timeout", args->transport.header_timeout_s,
                  "Seconds a request's line and headers may take to arrive (then 408)")
      ->capture_default_str();
  cmd->add_option("--body-timeout", args->transport.body_timeout_s,
                  "Seconds a request's body may take to arrive after its headers (then 408)")
      ->capture_default_str();
  cmd->add_option("--max-connections", args->transport.max_connections,
                  "Open connections at most; at the cap a new one replaces the oldest idle or "
                  "still-arriving one, else gets 503")
      ->capture_default_str();
  cmd->add_option("--max-connections-per-client", args->transport.max_connections_per_client,
                  "Open connections per client address (more get 429); 0: no cap")
      ->capture_default_str();
  cmd->callback([args] { serve(*args); });
}

}  // namespace kvc::cli
