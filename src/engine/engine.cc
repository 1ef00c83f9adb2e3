#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include "base/kernels.h"
#include "engine/kv_pool_size.h"
#include "engine/stop_matcher.h"
#include "kv/cache_namespace.h"
#include "model/model_fingerprint.h"

namespace kvc::engine {

namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

struct Engine::Waker {
  Mutex mu;
  Engine* engine GUARDED_BY(mu) = nullptr;
};

Engine::Engine(const model::LlamaModel& model, const model::Tokenizer& tokenizer,
               const EngineOptions& options)
    : model_(model),
      tokenizer_(tokenizer),
      options_(options),
      ttft_(Histogram::latency_ms_bounds()),
      itl_(Histogram::latency_ms_bounds()),
      e2e_(Histogram::latency_ms_bounds()),
      queue_(Histogram::latency_ms_bounds()) {
  const auto& c = model_.config();
  geometry_ = c.kv_cache_geometry(options_.kv_k_dtype, options_.kv_v_dtype, options_.block_tokens);
  options_.block_tokens = geometry_.block_tokens;
  const auto chunk = static_cast<size_t>(std::max(options_.max_batch_tokens, 1));
  const uint64_t bytes =
      options_.kv_memory_bytes != 0
          ? options_.kv_memory_bytes
          : default_kv_pool_bytes(geometry_, static_cast<size_t>(c.context_length), chunk,
                                  options_.max_running);
  KvCacheOptions ko;
  ko.prefix_cache = options_.prefix_cache;
  ko.partial_reuse = options_.partial_reuse;
  ko.session_ttl_ms = options_.session_ttl_ms;
  ko.session_max_blocks = options_.session_max_blocks;
  ko.tenant_pinned_max_blocks = options_.tenant_pinned_max_blocks;
  if (options_.prefix_cache) model_fingerprint_ = model::model_fingerprint(model_.file());
  ko.tiers = options_.kv_tiers;
  ko.model_fingerprint = model_fingerprint_;
  kv_ = std::make_unique<KvCacheManager>(geometry_, bytes, ko);
  pool_ = &kv_->pool();
  num_blocks_ = kv_->pool().num_blocks();
  arena_bytes_ = kv_->pool().arena_bytes();
  tenant_cap_ = kv_->tenant_pinned_max_blocks();
  SchedulerOptions so;
  so.max_batch_tokens = options_.max_batch_tokens;
  so.max_running = options_.max_running;
  so.cache_aware = options_.cache_aware;
  so.max_passed_over = options_.max_passed_over;
  so.reserve_blocks = options_.reserve_blocks;
  so.max_preemptions = options_.max_preemptions;
  so.context_length = static_cast<size_t>(c.context_length);
  scheduler_ = std::make_unique<Scheduler>(so);
  const int threads =
      options_.threads > 0 ? options_.threads : std::max(1u, std::thread::hardware_concurrency());
  threads_ = std::make_unique<ThreadPool>(threads);
  {
    MutexLock lock(state_mu_);
    if (kv_->has_tiers()) calibrate_costs();
  }
  waker_ = std::make_shared<Waker>();
  {
    MutexLock lock(waker_->mu);
    waker_->engine = this;
  }
  publish_stats();
  thread_ = std::thread([this] { loop(); });
}

void Engine::calibrate_costs() {
  // Prefills of a scratch sequence up to half the context (at most 64 blocks), in passes of 1, 4
  // and 2 blocks in turn so that the fixed, per-token and depth terms can be told apart, swept
  // up to three times within half a second: each pass is one sample for the cost model. The
  // blocks are never indexed, so nothing of it can be a cache hit.
  const size_t bt = geometry_.block_tokens;
  const size_t limit = std::max(
      4 * bt, std::min<size_t>(static_cast<size_t>(model_.config().context_length) / 2, 64 * bt));
  const auto vocab = static_cast<size_t>(model_.config().n_vocab);
  kv::BlockTable table(*pool_, kv_.get());
  if (!table.reserve(limit)) return;
  std::vector<model::BatchRow> rows;
  const auto start = std::chrono::steady_clock::now();
  const size_t sizes[] = {bt, 4 * bt, 2 * bt};
  size_t turn = 0;
  for (int sweep = 0; sweep < 3; ++sweep) {
    for (size_t at = 0; at < limit;) {
      const size_t n = std::min(sizes[turn++ % 3], limit - at);
      rows.clear();
      double position_sum = 0;
      for (size_t i = at; i < at + n; ++i) {
        rows.push_back({static_cast<int32_t>((i * 7919) % vocab), static_cast<int32_t>(i), &table,
                        i + 1 == at + n});
        position_sum += static_cast<double>(i);
      }
      const auto t0 = std::chrono::steady_clock::now();
      model_.forward(*threads_, *pool_, rows, scratch_);
      const auto t1 = std::chrono::steady_clock::now();
      kv_->cost_model().observe_pass(rows.size(), position_sum,
                                     std::chrono::duration<double, std::milli>(t1 - t0).count());
      if (t1 - start > std::chrono::milliseconds(500)) return;
      at += n;
    }
  }
}

Engine::~Engine() {
  shutdown(0);
  MutexLock lock(waker_->mu);
  waker_->engine = nullptr;
}

kv::Hash256 Engine::namespace_for(const std::string& tenant_salt,
                                  const std::string& adapter) const {
  return kv::namespace_hash({model_fingerprint_, options_.kv_k_dtype, options_.kv_v_dtype,
                             options_.block_tokens, tenant_salt, adapter,
                             kernels::arithmetic_identity()});
}

void Engine::wake() {
  {
    MutexLock lock(intake_mu_);
    ++wakes_;
  }
  intake_cv_.notify_all();
}

std::shared_ptr<RequestHandle> Engine::submit(Request request) {
  std::vector<Request> one;
  one.push_back(std::move(request));
  return submit_all(std::move(one)).front();
}

std::unique_ptr<Sequence> Engine::make_sequence(Request request) {
  const auto& c = model_.config();
  if (request.prompt.empty()) throw RequestError(RequestErrorKind::kInvalid, "the prompt is empty");
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= c.n_vocab) {
      throw RequestError(RequestErrorKind::kInvalid,
                         fmt::format("token id {} is outside the vocabulary of {}", t, c.n_vocab));
    }
  }
  for (int32_t t : request.stop_tokens) {
    if (t < 0 || t >= c.n_vocab) {
      throw RequestError(
          RequestErrorKind::kInvalid,
          fmt::format("stop token id {} is outside the vocabulary of {}", t, c.n_vocab));
    }
  }
  if (request.max_tokens < 1) {
    throw RequestError(RequestErrorKind::kInvalid,
                       fmt::format("max_tokens must be at least 1, got {}", request.max_tokens));
  }
  try {
    request.sampling.validate();
  } catch (const Error& e) {
    throw RequestError(RequestErrorKind::kInvalid, e.what());
  }
  const size_t context = c.context_length;
  if (request.prompt.size() >= context) {
    throw RequestError(RequestErrorKind::kTooLarge,
                       fmt::format("the prompt has {} tokens but the context holds {} (prompt "
                                   "and at least one generated token)",
                                   request.prompt.size(), context));
  }
  // Accepting means it will run: alone in the pool, its whole prompt and output must fit.
  const size_t longest = std::min(context, request.prompt.size() + request.max_tokens);
  // Under a window the scheduler shortens chunks to fit, so the decode figure is the floor.
  const size_t need = geometry_.blocks_for_sequence(longest);
  if (need > num_blocks_) {
    MutexLock lock(stats_mu_);
    ++stats_.rejected_too_large;
    throw RequestError(
        RequestErrorKind::kTooLarge,
        fmt::format("the request needs {} KV blocks ({} tokens of prompt and output) but the "
                    "pool has {} blocks in all; lower max_tokens or raise --kv-memory",
                    need, longest, num_blocks_));
  }
  auto s = std::make_unique<Sequence>();
  s->id = next_id_++;
  s->handle = std::make_shared<RequestHandle>(s->id);
  s->tokens = request.prompt;
  s->sampler = std::make_unique<model::Sampler>(request.sampling);
  s->stop = std::make_unique<StopMatcher>(request.stop);
  s->stats.prompt_tokens = request.prompt.size();
  s->submitted_ms = now_ms();
  s->req = std::move(request);
  s->handle->set_on_cancel([waker = waker_] {
    MutexLock lock(waker->mu);
    if (waker->engine != nullptr) waker->engine->wake();
  });
  return s;
}

std::vector<std::shared_ptr<RequestHandle>> Engine::submit_all(std::vector<Request> requests) {
  std::vector<std::unique_ptr<Sequence>> sequences;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (Request& r : requests) {
    sequences.push_back(make_sequence(std::move(r)));
    handles.push_back(sequences.back()->handle);
  }
  const size_t n = sequences.size();
  {
    MutexLock lock(intake_mu_);
    if (!accepting_) {
      throw RequestError(RequestErrorKind::kShutdown, "the engine is shutting down");
    }
    if (queued_ + n > options_.max_waiting) {
      MutexLock stats_lock(stats_mu_);
      stats_.rejected_overloaded += n;
      throw RequestError(
          RequestErrorKind::kOverloaded,
          n == 1 ? fmt::format("overloaded: {} requests are already waiting", queued_)
                 : fmt::format("overloaded: {} requests are already waiting, no room for {} more",
                               queued_, n));
    }
    queued_ += n;
    ++wakes_;
    for (auto& s : sequences) incoming_.push_back(std::move(s));
  }
  {
    MutexLock lock(stats_mu_);
    stats_.submitted += n;
  }
  intake_cv_.notify_all();
  return handles;
}

void Engine::loop() {
  for (;;) {
    uint64_t seen;
    {
      MutexLock lock(intake_mu_);
      seen = wakes_;
    }
    bool progressed = true;
    try {
      progressed = step();
    } catch (const std::exception& e) {
      fail_all(e.what());
    }
    MutexLock lock(intake_mu_);
    const bool empty = incoming_.empty() && queued_ == 0 && scheduler_running() == 0;
    if (stop_ && (now_ms() >= drain_deadline_ms_ || empty)) break;
    if (progressed) continue;
    // Nothing can change until an event: sleep until one (or the drain deadline).
    if (stop_) {
      const double left = std::max(0.0, drain_deadline_ms_ - now_ms());
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double, std::milli>(left));
      while (wakes_ == seen && intake_cv_.wait_until(lock, deadline)) {
      }
    } else {
      while (wakes_ == seen && !stop_) intake_cv_.wait(lock);
    }
  }
  // Whatever is left when the drain time runs out is cancelled.
  MutexLock lock(state_mu_);
  intake();
  for (Sequence* s : scheduler_->all()) {
    finish(*s, FinishReason::kCancelled, "the server is shutting down");
  }
  scheduler_->take_finished();
  publish_stats();
}

void Engine::fail_all(const std::string& what) {
  MutexLock lock(state_mu_);
  intake();
  for (Sequence* s : scheduler_->all()) {
    finish(*s, FinishReason::kError, "internal error (the engine step failed): " + what);
  }
  scheduler_->take_finished();
  publish_stats();
}

void Engine::shutdown(double drain_ms) {
  {
    MutexLock lock(intake_mu_);
    if (!thread_.joinable()) return;
    accepting_ = false;
    stop_ = true;
    drain_deadline_ms_ = now_ms() + drain_ms;
    ++wakes_;
  }
  intake_cv_.notify_all();
  thread_.join();
}

void Engine::intake() {
  std::vector<std::unique_ptr<Sequence>> fresh;
  {
    MutexLock lock(intake_mu_);
    fresh.swap(incoming_);
  }
  for (auto& s : fresh) scheduler_->enqueue(std::move(s));
}

void Engine::finish(Sequence& s, FinishReason reason, const std::string& error) {
  if (s.done) return;
  s.done = true;
  const double now = now_ms();
  // Text held back because it might begin a stop string is shown at any end but that stop
  // string's own (a stop token ends the request too, and it is not that text).
  const bool shown_end = reason == FinishReason::kLength || reason == FinishReason::kEos ||
                         reason == FinishReason::kContext || reason == FinishReason::kStop;
  if (s.stop && !s.stop->stopped() && shown_end) {
    std::string tail = s.stop->flush();
    if (!tail.empty()) s.handle->push(TokenEvent{-1, std::move(tail), {}});
  }
  if (s.table) {
    s.stats.kv_blocks = s.table->held_blocks() + s.table->open_key_blocks().size();
    if (s.window_table) {
      s.stats.kv_blocks += s.window_table->held_blocks() + s.window_table->open_key_blocks().size();
    }
    kv_->seal(s, true);
    kv_->keep_session(s.req.session_id, s);
    kv_->detach(s);
  }
  s.stats.finish_reason = reason;
  s.stats.e2e_ms = now - s.submitted_ms;
  if (s.stats.generated_tokens > 0) s.stats.decode_ms = s.last_token_ms - s.first_token_ms;
  if (s.stats.generated_tokens > 1) {
    s.stats.tpot_ms = s.stats.decode_ms / static_cast<double>(s.stats.generated_tokens - 1);
  }
  if (s.stop) s.stats.stop_string = s.stop->matched();
  e2e_.observe(s.stats.e2e_ms);
  {
    MutexLock lock(stats_mu_);
    ++stats_.finished;
    if (reason == FinishReason::kCancelled) ++stats_.cancelled;
  }
  // Told after the next stats snapshot, so a caller that sees its request end also sees its
  // blocks released in stats().
  endings_.push_back({s.handle, s.stats, error});
}

void Engine::after_row(Sequence& s, std::span<const float> logits) {
  TokenEvent event;
  if (s.req.record_logits) event.logits.assign(logits.begin(), logits.end());
  const int32_t token = s.sampler->sample(logits, s.tokens);
  const double now = now_ms();
  if (s.stats.generated_tokens == 0) {
    s.first_token_ms = now;
    s.stats.ttft_ms = now - s.submitted_ms;
    s.stats.prefill_ms = now - s.admitted_ms;
    ttft_.observe(s.stats.ttft_ms);
  } else {
    itl_.observe(now - s.last_token_ms);
  }
  s.last_token_ms = now;
  s.tokens.push_back(token);
  ++s.stats.generated_tokens;
  {
    MutexLock lock(stats_mu_);
    ++stats_.generated_tokens;
  }
  event.token = token;
  const bool eos = !s.req.ignore_eos && tokenizer_.is_eog(token);
  const bool stop_token = std::find(s.req.stop_tokens.begin(), s.req.stop_tokens.end(), token) !=
                          s.req.stop_tokens.end();
  if (!eos && !stop_token) event.text = s.stop->push(tokenizer_.piece(token));
  s.handle->push(std::move(event));
  if (eos) {
    finish(s, FinishReason::kEos);
  } else if (stop_token || s.stop->stopped()) {
    finish(s, FinishReason::kStop);
  } else if (s.stats.generated_tokens >= static_cast<size_t>(s.req.max_tokens)) {
    finish(s, FinishReason::kLength);
  } else if (s.tokens.size() >= static_cast<size_t>(model_.config().context_length)) {
    finish(s, FinishReason::kContext);
  }
}

bool Engine::step() {
  StepPlan plan;
  std::vector<model::BatchRow> rows;
  {
    MutexLock lock(state_mu_);
    intake();
    kv_->expire();
    bool changed = false;
    for (Sequence* s : scheduler_->all()) {
      if (s->handle->cancel_requested()) {
        finish(*s, FinishReason::kCancelled);
        changed = true;
      }
    }
    plan = scheduler_->plan(*kv_);
    const double now = now_ms();
    for (auto& [s, m] : plan.admitted) {
      s->admitted_ms = now;
      if (s->admitted_once) continue;
      s->admitted_once = true;
      s->stats.queue_ms = now - s->submitted_ms;
      s->stats.cached_tokens = m.cached_tokens;
      s->stats.miss = m.miss;
      queue_.observe(s->stats.queue_ms);
      MutexLock stats_lock(stats_mu_);
      stats_.prompt_tokens += s->stats.prompt_tokens;
      stats_.cached_prompt_tokens += m.cached_tokens;
    }
    for (auto& [s, why] : plan.failed) finish(*s, FinishReason::kError, why);
    if (plan.preempted > 0) {
      MutexLock stats_lock(stats_mu_);
      stats_.preemptions += plan.preempted;
    }
    changed = changed || !plan.empty();
    const size_t ended = scheduler_->take_finished().size();
    {
      MutexLock intake_lock(intake_mu_);
      queued_ = incoming_.size() + scheduler_->waiting();
    }
    if (plan.rows.empty()) {
      publish_stats();
      return changed || ended > 0;
    }
    for (auto& [s, n] : plan.rows) {
      for (size_t i = s->written; i < s->written + n; ++i) {
        rows.push_back({s->tokens[i], static_cast<int32_t>(i), s->table.get(),
                        i + 1 == s->tokens.size(), s->window_table.get()});
      }
    }
  }
  // The forward pass runs unlocked: it reads and writes only blocks the planned sequences hold,
  // which no cache operation can free or change.
  if (options_.before_forward) options_.before_forward();
  const auto forward_start = std::chrono::steady_clock::now();
  const std::span<const float> logits = model_.forward(*threads_, *pool_, rows, scratch_);
  const double forward_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - forward_start)
          .count();
  {
    MutexLock lock(state_mu_);
    double position_sum = 0;
    for (const model::BatchRow& r : rows) position_sum += r.pos;
    kv_->cost_model().observe_pass(rows.size(), position_sum, forward_ms);
    const size_t vocab = model_.config().n_vocab;
    size_t k = 0;
    for (auto& [s, n] : plan.rows) {
      s->written += n;
      kv_->seal(*s, false);
      if (s->written == s->tokens.size()) {
        if (!s->done) after_row(*s, logits.subspan(k * vocab, vocab));
        ++k;
      }
    }
    scheduler_->take_finished();
    {
      MutexLock intake_lock(intake_mu_);
      queued_ = incoming_.size() + scheduler_->waiting();
    }
    {
      MutexLock stats_lock(stats_mu_);
      ++stats_.steps;
    }
    publish_stats();
  }
  return true;
}

size_t Engine::scheduler_running() const {
  return running_count_.load();
}

void Engine::publish_stats() {
  const KvCacheCounts blocks = kv_->counts();
  const kv::PrefixIndexStats cache = kv_->index_stats();
  const size_t sessions = kv_->session_count();
  const size_t running = scheduler_->running();
  const TierCounts tiers = kv_->tier_counts();
  running_count_.store(running);
  {
    MutexLock lock(stats_mu_);
    stats_.tiers = tiers;
    stats_.blocks = blocks;
    stats_.cache = cache;
    stats_.sessions = sessions;
    stats_.running = running;
  }
  for (Ending& e : endings_) e.handle->finish(e.stats, std::move(e.error));
  endings_.clear();
}

bool Engine::close_session(const std::string& id) {
  bool closed;
  {
    MutexLock lock(state_mu_);
    closed = kv_->close_session(id);
    publish_stats();
  }
  wake();
  return closed;
}

kv::PrefixMatch Engine::explain(const kv::Hash256& ns, std::span<const int32_t> tokens) const {
  MutexLock lock(state_mu_);
  return kv_->explain(ns, tokens);
}

kv::PinLease Engine::pin(const kv::Hash256& ns, std::span<const int32_t> tokens, double ttl_ms) {
  MutexLock lock(state_mu_);
  const kv::PinLease lease = kv_->pin(ns, tokens, ttl_ms);
  publish_stats();
  return lease;
}

size_t Engine::flush_cache() {
  size_t n;
  {
    MutexLock lock(state_mu_);
    n = kv_->flush();
    publish_stats();
  }
  wake();
  return n;
}

size_t Engine::flush_tiers() {
  MutexLock lock(state_mu_);
  const size_t n = kv_->flush_tiers();
  publish_stats();
  return n;
}

void Engine::drain_tiers() {
  MutexLock lock(state_mu_);
  kv_->drain_tiers();
  publish_stats();
}

EngineStats Engine::stats() const {
  EngineStats s;
  {
    MutexLock lock(stats_mu_);
    s = stats_;
  }
  MutexLock intake_lock(intake_mu_);
  s.waiting = queued_;
  return s;
}

kv::NamespaceStats Engine::namespace_stats(const kv::Hash256& ns) const {
  MutexLock lock(state_mu_);
  return kv_->namespace_stats(ns);
}

}  // namespace kvc::engine
