#include "engine/engine.h"

#include <algorithm>
#include <chrono>

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

struct Engine::Sequence {
  uint64_t id = 0;
  Request req;
  std::shared_ptr<RequestHandle> handle;
  std::vector<int32_t> tokens;  // prompt, then sampled tokens; the last may not be written yet
  size_t written = 0;           // tokens whose keys and values are in the table
  std::unique_ptr<kv::BlockTable> table;
  std::unique_ptr<model::Sampler> sampler;
  std::unique_ptr<StopMatcher> stop;
  RequestStats stats;
  bool admitted_once = false;
  bool done = false;
  bool preempted = false;
  int passed_over = 0;
  double submitted_ms = 0, first_token_ms = 0, last_token_ms = 0;
  size_t cached_hint = 0;  // cached prefix length, for cache-aware ordering
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
  if (options_.max_batch_tokens < 1) fail("max batch tokens must be >= 1");
  if (options_.max_running < 1) fail("max running sequences must be >= 1");
  const auto& c = model_.config();
  const kv::KvGeometry g = c.kv_geometry(options_.kv_dtype, options_.block_tokens);
  uint64_t bytes = options_.kv_memory_bytes;
  if (bytes == 0) {
    // Room for every running sequence at full context, within 2 GiB but never below one.
    const uint64_t context = g.blocks_for_tokens(c.context_length) * g.bytes_per_block();
    bytes = std::max(context, std::min<uint64_t>(context * options_.max_running, 2ull << 30));
  }
  pool_ = std::make_unique<kv::BlockPool>(g, bytes);
  kv::PrefixIndexOptions io;
  io.enabled = options_.prefix_cache;
  io.partial_reuse = options_.partial_reuse;
  index_ = std::make_unique<kv::PrefixIndex>(*pool_, io);
  if (options_.prefix_cache) model_fingerprint_ = model::model_fingerprint(model_.file());
  const int threads =
      options_.threads > 0 ? options_.threads : std::max(1u, std::thread::hardware_concurrency());
  threads_ = std::make_unique<ThreadPool>(threads);
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  shutdown(0);
}

kv::Hash256 Engine::namespace_for(const std::string& tenant_salt,
                                  const std::string& adapter) const {
  return kv::namespace_hash(
      {model_fingerprint_, options_.kv_dtype, options_.block_tokens, tenant_salt, adapter});
}

std::shared_ptr<RequestHandle> Engine::submit(Request request) {
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
  const size_t longest = std::min(context, request.prompt.size() + request.max_tokens);
  const size_t need = pool_->geometry().blocks_for_tokens(longest);
  if (need > pool_->num_blocks()) {
    std::lock_guard lock(stats_mu_);
    ++stats_.rejected_too_large;
    throw RequestError(
        RequestErrorKind::kTooLarge,
        fmt::format("the request needs {} KV blocks ({} tokens of prompt and output) but the "
                    "pool has {} blocks in all; lower max_tokens or raise --kv-memory",
                    need, longest, pool_->num_blocks()));
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
  auto handle = s->handle;
  {
    std::lock_guard lock(intake_mu_);
    if (!accepting_) {
      throw RequestError(RequestErrorKind::kShutdown, "the engine is shutting down");
    }
    if (queued_ >= options_.max_waiting) {
      std::lock_guard stats_lock(stats_mu_);
      ++stats_.rejected_overloaded;
      throw RequestError(RequestErrorKind::kOverloaded,
                         fmt::format("overloaded: {} requests are already waiting", queued_));
    }
    ++queued_;
    incoming_.push_back(std::move(s));
  }
  {
    std::lock_guard lock(stats_mu_);
    ++stats_.submitted;
  }
  intake_cv_.notify_one();
  return handle;
}

void Engine::loop() {
  bool idle = false;
  for (;;) {
    {
      std::unique_lock lock(intake_mu_);
      const auto has_work = [&] {
        return stop_ || !incoming_.empty() || queued_ > 0 || running_count_ > 0;
      };
      // An idle engine sleeps; one that could not progress (waiting for blocks) polls.
      if (idle || !has_work()) intake_cv_.wait_for(lock, std::chrono::milliseconds(10), has_work);
      if (stop_ && (now_ms() >= drain_deadline_ms_ ||
                    (incoming_.empty() && queued_ == 0 && running_count_ == 0))) {
        break;
      }
    }
    idle = !step();
  }
  // Whatever is left when the drain time runs out is cancelled.
  std::lock_guard lock(state_mu_);
  intake();
  for (auto& s : running_) finish(*s, "cancelled", "the server is shutting down");
  for (auto& s : waiting_) finish(*s, "cancelled", "the server is shutting down");
  running_.clear();
  waiting_.clear();
}

void Engine::shutdown(double drain_ms) {
  {
    std::lock_guard lock(intake_mu_);
    if (!thread_.joinable()) return;
    accepting_ = false;
    stop_ = true;
    drain_deadline_ms_ = now_ms() + drain_ms;
  }
  intake_cv_.notify_all();
  thread_.join();
}

void Engine::intake() {
  std::vector<std::unique_ptr<Sequence>> fresh;
  {
    std::lock_guard lock(intake_mu_);
    fresh.swap(incoming_);
  }
  for (auto& s : fresh) waiting_.push_back(std::move(s));
  for (auto& s : waiting_) {
    if (s->handle->cancel_requested()) finish(*s, "cancelled");
  }
  std::erase_if(waiting_, [&](const auto& s) {
    if (!s->done) return false;
    std::lock_guard lock(intake_mu_);
    --queued_;
    return true;
  });
}

bool Engine::fits(const Sequence& s) const {
  const kv::KvGeometry& g = pool_->geometry();
  const kv::PrefixMatch m = index_->explain(s.req.ns, s.tokens, s.tokens.size() - 1);
  const size_t need = g.blocks_for_tokens(s.tokens.size() + 1) - m.shared_blocks +
                      static_cast<size_t>(options_.reserve_blocks);
  const kv::PoolCounts c = pool_->counts();
  return need <= c.free + c.cached;
}

void Engine::start(Sequence& s) {
  const double now = now_ms();
  s.table = std::make_unique<kv::BlockTable>(*pool_);
  const kv::PrefixMatch m = index_->match(s.req.ns, s.tokens, s.tokens.size() - 1, *s.table);
  s.written = m.cached_tokens;
  s.preempted = false;
  if (!s.admitted_once) {
    s.admitted_once = true;
    s.stats.queue_ms = now - s.submitted_ms;
    s.stats.cached_tokens = m.cached_tokens;
    s.stats.miss = m.miss;
    queue_.observe(s.stats.queue_ms);
    std::lock_guard lock(stats_mu_);
    stats_.prompt_tokens += s.stats.prompt_tokens;
    stats_.cached_prompt_tokens += m.cached_tokens;
  }
}

void Engine::admit() {
  if (waiting_.empty()) return;
  if (options_.cache_aware) {
    for (auto& s : waiting_) {
      s->cached_hint = index_->explain(s->req.ns, s->tokens, s->tokens.size() - 1).cached_tokens;
    }
  }
  // Priority first; then a request passed over too often; then (cache-aware) the longest
  // cached prefix; then arrival order.
  std::stable_sort(waiting_.begin(), waiting_.end(), [&](const auto& a, const auto& b) {
    if (a->req.priority != b->req.priority) return a->req.priority > b->req.priority;
    if (options_.cache_aware) {
      const bool a_due = a->passed_over >= options_.max_passed_over;
      const bool b_due = b->passed_over >= options_.max_passed_over;
      if (a_due != b_due) return a_due;
      if (a->cached_hint != b->cached_hint) return a->cached_hint > b->cached_hint;
    }
    return a->id < b->id;
  });
  for (auto it = waiting_.begin();
       it != waiting_.end() && running_.size() < static_cast<size_t>(options_.max_running);) {
    Sequence& s = **it;
    if (shares_pending_prefill(s)) {
      ++it;  // wait until the running request has sealed the shared blocks, then share them
      continue;
    }
    if (!fits(s)) break;
    start(s);
    for (auto& other : waiting_) {
      if (other->id < s.id) ++other->passed_over;
    }
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
    std::lock_guard lock(intake_mu_);
    --queued_;
  }
}

bool Engine::shares_pending_prefill(const Sequence& s) const {
  if (!index_->enabled()) return false;
  const size_t block = pool_->geometry().block_tokens;
  const size_t cached = index_->explain(s.req.ns, s.tokens, s.tokens.size() - 1).cached_tokens;
  for (const auto& r : running_) {
    if (r->done || r->preempted || r->req.ns != s.req.ns) continue;
    if (r->tokens.size() - r->written <= 1) continue;  // decoding: its prompt is sealed already
    const size_t n = std::min({s.tokens.size() - 1, r->tokens.size()});
    size_t common = 0;
    while (common < n && s.tokens[common] == r->tokens[common]) ++common;
    if (common >= cached + block) return true;
  }
  return false;
}

Engine::Sequence* Engine::pick_victim(const Sequence& requester) {
  Sequence* victim = nullptr;
  for (auto& s : running_) {
    if (s.get() == &requester || s->done || s->preempted || !s->table) continue;
    const bool lower = s->req.priority < requester.req.priority ||
                       (s->req.priority == requester.req.priority && s->id > requester.id);
    if (!lower) continue;
    if (victim == nullptr || s->req.priority < victim->req.priority ||
        (s->req.priority == victim->req.priority && s->id > victim->id)) {
      victim = s.get();
    }
  }
  return victim;
}

void Engine::preempt(Sequence& s) {
  // Sealed blocks are already in the index and stay cached; the rest go back to the pool.
  s.table->clear();
  s.table.reset();
  s.written = 0;
  s.preempted = true;
  ++s.stats.preemptions;
  std::lock_guard lock(stats_mu_);
  ++stats_.preemptions;
}

bool Engine::make_room(Sequence& s, size_t tokens) {
  for (;;) {
    if (s.table->reserve(tokens) && s.table->ensure_writable(s.written)) return true;
    if (Sequence* victim = pick_victim(s)) {
      preempt(*victim);
      continue;
    }
    const bool alone = std::none_of(running_.begin(), running_.end(), [&](const auto& o) {
      return o.get() != &s && !o->done && !o->preempted;
    });
    if (!alone) {
      preempt(s);  // the newest, lowest-priority sequence yields to the others
      return false;
    }
    // Alone and still short: pinned session blocks are the last resort.
    if (index_->evict(pool_->geometry().blocks_for_tokens(tokens), true) == 0) {
      finish(s, "error", "the KV pool cannot hold this sequence");
      return false;
    }
  }
}

void Engine::finish(Sequence& s, const std::string& reason, const std::string& error) {
  if (s.done) return;
  s.done = true;
  const double now = now_ms();
  if (s.stop && reason != "stop" && reason != "cancelled" && reason != "error") {
    std::string tail = s.stop->flush();
    if (!tail.empty()) s.handle->push(TokenEvent{-1, std::move(tail), {}});
  }
  if (s.table) {
    index_->insert(s.req.ns, s.tokens, s.written, *s.table, true);
    keep_session(s);
    s.table->clear();
    s.table.reset();
  }
  s.stats.finish_reason = reason;
  s.stats.e2e_ms = now - s.submitted_ms;
  if (s.stats.generated_tokens > 1) {
    s.stats.tpot_ms = (s.last_token_ms - s.first_token_ms) / (s.stats.generated_tokens - 1);
  }
  if (s.stop) s.stats.stop_string = s.stop->matched();
  e2e_.observe(s.stats.e2e_ms);
  {
    std::lock_guard lock(stats_mu_);
    ++stats_.finished;
    if (reason == "cancelled") ++stats_.cancelled;
  }
  s.handle->finish(s.stats, error);
}

void Engine::after_row(Sequence& s, std::span<const float> logits) {
  TokenEvent event;
  if (s.req.record_logits) event.logits.assign(logits.begin(), logits.end());
  const int32_t token = s.sampler->sample(logits, s.tokens);
  const double now = now_ms();
  if (s.stats.generated_tokens == 0) {
    s.first_token_ms = now;
    s.stats.ttft_ms = now - s.submitted_ms;
    ttft_.observe(s.stats.ttft_ms);
  } else {
    itl_.observe(now - s.last_token_ms);
  }
  s.last_token_ms = now;
  s.tokens.push_back(token);
  ++s.stats.generated_tokens;
  {
    std::lock_guard lock(stats_mu_);
    ++stats_.generated_tokens;
  }
  event.token = token;
  const bool eos = !s.req.ignore_eos && token == tokenizer_.eos_id();
  const bool stop_token = std::find(s.req.stop_tokens.begin(), s.req.stop_tokens.end(), token) !=
                          s.req.stop_tokens.end();
  if (!eos && !stop_token) event.text = s.stop->push(tokenizer_.piece(token));
  s.handle->push(std::move(event));
  if (eos) {
    finish(s, "eos");
  } else if (stop_token || s.stop->stopped()) {
    finish(s, "stop");
  } else if (s.stats.generated_tokens >= static_cast<size_t>(s.req.max_tokens)) {
    finish(s, "length");
  } else if (s.tokens.size() >= static_cast<size_t>(model_.config().context_length)) {
    finish(s, "context");
  }
}

bool Engine::step() {
  std::lock_guard lock(state_mu_);
  struct CountRunning {
    Engine& e;
    ~CountRunning() { e.running_count_ = e.running_.size(); }
  } count_running{*this};
  intake();
  expire_sessions();
  for (auto& s : running_) {
    if (s->handle->cancel_requested()) finish(*s, "cancelled");
  }
  std::erase_if(running_, [](const auto& s) { return s->done; });
  admit();
  if (running_.empty()) return false;

  // Decodes (one token left to write) first, then prefills; each by priority, then age.
  std::vector<Sequence*> order;
  for (auto& s : running_) order.push_back(s.get());
  std::stable_sort(order.begin(), order.end(), [](const Sequence* a, const Sequence* b) {
    const bool ad = a->tokens.size() - a->written == 1, bd = b->tokens.size() - b->written == 1;
    if (ad != bd) return ad;
    if (a->req.priority != b->req.priority) return a->req.priority > b->req.priority;
    return a->id < b->id;
  });
  size_t budget = static_cast<size_t>(options_.max_batch_tokens);
  std::vector<std::pair<Sequence*, size_t>> plan;
  for (Sequence* s : order) {
    if (budget == 0) break;
    if (s->done || s->preempted) continue;
    const size_t n = std::min(s->tokens.size() - s->written, budget);
    if (!make_room(*s, s->written + n)) continue;
    budget -= n;
    plan.emplace_back(s, n);
  }
  // Requeue the preempted at the front, oldest first; they resume from their cached blocks.
  std::vector<std::unique_ptr<Sequence>> requeue;
  for (auto& s : running_) {
    if (s->preempted && !s->done) requeue.push_back(std::move(s));
  }
  std::erase_if(running_, [](const auto& s) { return !s || s->done; });
  std::sort(requeue.begin(), requeue.end(),
            [](const auto& a, const auto& b) { return a->id > b->id; });
  for (auto& s : requeue) {
    waiting_.push_front(std::move(s));
    std::lock_guard intake_lock(intake_mu_);
    ++queued_;
  }
  std::erase_if(plan, [](const auto& p) { return p.first->done || p.first->preempted; });
  if (plan.empty()) return !requeue.empty();

  std::vector<model::BatchRow> rows;
  for (auto& [s, n] : plan) {
    for (size_t i = s->written; i < s->written + n; ++i) {
      rows.push_back(
          {s->tokens[i], static_cast<int32_t>(i), s->table.get(), i + 1 == s->tokens.size()});
    }
  }
  const std::span<const float> logits = model_.forward(*threads_, *pool_, rows, scratch_);
  const size_t vocab = model_.config().n_vocab;
  size_t k = 0;
  for (auto& [s, n] : plan) {
    s->written += n;
    index_->insert(s->req.ns, s->tokens, s->written, *s->table, false);
    if (s->written == s->tokens.size()) {
      after_row(*s, logits.subspan(k * vocab, vocab));
      ++k;
    }
  }
  std::erase_if(running_, [](const auto& s) { return s->done; });
  std::lock_guard stats_lock(stats_mu_);
  ++stats_.steps;
  return true;
}

void Engine::keep_session(Sequence& s) {
  if (s.req.session_id.empty() || !index_->enabled()) return;
  Session& session = sessions_[s.req.session_id];
  if (!session.pinned.empty()) index_->unpin(session.ns, session.pinned);
  size_t keep = s.written;
  if (options_.session_max_blocks > 0) {
    keep = std::min(keep, options_.session_max_blocks * pool_->geometry().block_tokens);
  }
  session.ns = s.req.ns;
  session.pinned.assign(s.tokens.begin(), s.tokens.begin() + keep);
  session.expires_at_ms = now_ms() + options_.session_ttl_ms;
  if (!session.pinned.empty()) index_->pin(session.ns, session.pinned, options_.session_ttl_ms);
}

void Engine::expire_sessions() {
  const double now = now_ms();
  std::erase_if(sessions_, [&](auto& entry) {
    if (entry.second.expires_at_ms > now) return false;
    index_->unpin(entry.second.ns, entry.second.pinned);
    return true;
  });
}

bool Engine::close_session(const std::string& id) {
  std::lock_guard lock(state_mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return false;
  index_->unpin(it->second.ns, it->second.pinned);
  sessions_.erase(it);
  return true;
}

kv::PrefixMatch Engine::explain(const kv::Hash256& ns, std::span<const int32_t> tokens) const {
  std::lock_guard lock(state_mu_);
  return index_->explain(ns, tokens, tokens.empty() ? 0 : tokens.size() - 1);
}

size_t Engine::pin(const kv::Hash256& ns, std::span<const int32_t> tokens, double ttl_ms) {
  std::lock_guard lock(state_mu_);
  return index_->pin(ns, tokens, ttl_ms);
}

size_t Engine::flush_cache() {
  std::lock_guard lock(state_mu_);
  return index_->flush();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(state_mu_);
  EngineStats s;
  {
    std::lock_guard stats_lock(stats_mu_);
    s = stats_;
  }
  s.running = running_.size();
  {
    std::lock_guard intake_lock(intake_mu_);
    s.waiting = queued_;
  }
  s.sessions = sessions_.size();
  s.blocks = pool_->counts();
  s.cache = index_->stats();
  return s;
}

kv::NamespaceStats Engine::namespace_stats(const kv::Hash256& ns) const {
  std::lock_guard lock(state_mu_);
  return index_->namespace_stats(ns);
}

}  // namespace kvc::engine
