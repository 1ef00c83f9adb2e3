#include "engine/scheduler.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/error.h"

namespace kvc::engine {

Scheduler::Scheduler(const SchedulerOptions& options) : options_(options) {
  if (options_.max_batch_tokens < 1) fail("max batch tokens must be >= 1");
  if (options_.max_running < 1) fail("max running sequences must be >= 1");
  if (options_.reserve_blocks < 0) fail("reserve blocks must be >= 0");
  if (options_.max_preemptions < 0) fail("max preemptions must be >= 0");
}

void Scheduler::enqueue(std::unique_ptr<Sequence> s) {
  waiting_.push_back(std::move(s));
}

std::vector<Sequence*> Scheduler::all() {
  std::vector<Sequence*> out;
  for (auto& s : running_) out.push_back(s.get());
  for (auto& s : waiting_) out.push_back(s.get());
  return out;
}

std::vector<std::unique_ptr<Sequence>> Scheduler::take_finished() {
  std::vector<std::unique_ptr<Sequence>> out;
  for (auto& s : running_) {
    if (s->done) out.push_back(std::move(s));
  }
  std::erase_if(running_, [](const auto& s) { return !s; });
  for (auto& s : waiting_) {
    if (s->done) out.push_back(std::move(s));
  }
  std::erase_if(waiting_, [](const auto& s) { return !s; });
  return out;
}

std::pair<size_t, size_t> Scheduler::admission_extent(KvCacheManager& kv, const Sequence& s) const {
  const size_t tokens = s.reserve_all ? s.longest(options_.context_length) : s.tokens.size() + 1;
  auto chunk = static_cast<size_t>(options_.max_batch_tokens);
  // Under a window, a pool too small for a whole chunk's reach still runs the sequence: alone,
  // in shorter chunks (see plan()).
  if (kv.pool().geometry().blocks_for_sequence(tokens, chunk) > kv.pool().num_blocks()) chunk = 1;
  return {tokens, chunk};
}

size_t Scheduler::claim(KvCacheManager& kv, const Sequence& s) const {
  if (!s.reserve_all || !kv.pool().geometry().slides() || s.done || s.preempted || !s.table) {
    return 0;
  }
  const auto [tokens, chunk] = admission_extent(kv, s);
  const size_t peak = kv.pool().geometry().blocks_for_sequence(tokens, chunk);
  size_t held = s.table->held_blocks() + s.table->open_key_blocks().size();
  if (s.window_table) {
    held += s.window_table->held_blocks() + s.window_table->open_key_blocks().size();
  }
  return peak - std::min(peak, held);
}

size_t Scheduler::claimed(KvCacheManager& kv, const Sequence* except) const {
  size_t blocks = 0;
  for (const auto& s : running_) {
    if (s.get() != except) blocks += claim(kv, *s);
  }
  return blocks;
}

bool Scheduler::fits(KvCacheManager& kv, Sequence& s) {
  const size_t others = running_.size();
  const size_t headroom =
      others == 0 ? 0 : static_cast<size_t>(options_.reserve_blocks) * (others + 1);
  const auto [tokens, chunk] = admission_extent(kv, s);
  return kv.blocks_to_admit(s, tokens, chunk) + headroom + claimed(kv, nullptr) <= kv.room_for(s);
}

bool Scheduler::shares_pending_prefill(KvCacheManager& kv, Sequence& s) {
  if (!kv.options().prefix_cache) return false;
  const size_t block = kv.pool().geometry().block_tokens;
  const size_t cached = kv.computed(s).cached_tokens;
  for (const auto& r : running_) {
    if (r->done || r->req.ns != s.req.ns) continue;
    if (r->pending() <= 1) continue;  // decoding: its prompt is sealed already
    const size_t n = std::min(s.tokens.size() - 1, r->tokens.size());
    size_t common = 0;
    while (common < n && s.tokens[common] == r->tokens[common]) ++common;
    if (common >= cached + block) return true;
  }
  return false;
}

void Scheduler::admit(KvCacheManager& kv, StepPlan& plan) {
  if (waiting_.empty()) return;
  // Priority first; then a request passed over too often; then (cache-aware) the longest
  // cached prefix; then arrival order (so a preempted request, older, goes first).
  std::stable_sort(waiting_.begin(), waiting_.end(), [&](const auto& a, const auto& b) {
    if (a->req.priority != b->req.priority) return a->req.priority > b->req.priority;
    if (options_.cache_aware) {
      const bool a_due = a->passed_over >= options_.max_passed_over;
      const bool b_due = b->passed_over >= options_.max_passed_over;
      if (a_due != b_due) return a_due;
      const size_t ah = kv.computed(*a).cached_tokens, bh = kv.computed(*b).cached_tokens;
      if (ah != bh) return ah > bh;
    }
    return a->id < b->id;
  });
  for (auto it = waiting_.begin();
       it != waiting_.end() && running_.size() < static_cast<size_t>(options_.max_running);) {
    Sequence& s = **it;
    if (s.done) {
      ++it;
      continue;
    }
    if (shares_pending_prefill(kv, s)) {
      ++it;  // wait until the running request has sealed the shared blocks, then share them
      continue;
    }
    if (!fits(kv, s)) break;
    const kv::PrefixMatch m = kv.attach(s);
    // Under a sliding window blocks for the whole output cannot be taken ahead (they would
    // outnumber the window's): its claim keeps their room instead.
    const bool slides = kv.pool().geometry().slides();
    if (s.reserve_all && !slides && !kv.grow(s, s.longest(options_.context_length))) {
      kv.detach(s);  // the room was counted but could not be taken: try again next step
      break;
    }
    s.preempted = false;
    plan.admitted.emplace_back(&s, m);
    for (auto& other : waiting_) {
      if (other->id < s.id) ++other->passed_over;
    }
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
  }
}

Sequence* Scheduler::pick_victim(const Sequence& requester) {
  Sequence* victim = nullptr;
  for (auto& s : running_) {
    if (s.get() == &requester || s->done || s->preempted || !s->table) continue;
    if (s->stats.preemptions >= options_.max_preemptions) continue;  // protected
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

void Scheduler::preempt(KvCacheManager& kv, Sequence& s, StepPlan& plan) {
  // Sealed blocks are already indexed and stay cached; it resumes from them when readmitted.
  kv.detach(s);
  s.preempted = true;
  s.reserve_all = s.stats.preemptions >= options_.max_preemptions;
  ++s.stats.preemptions;
  ++plan.preempted;
}

StepPlan Scheduler::plan(KvCacheManager& kv) {
  StepPlan plan;
  admit(kv, plan);
  if (running_.empty()) return plan;

  // Decodes first, then prefills; each by priority, then age.
  std::vector<Sequence*> order;
  for (auto& s : running_) {
    if (!s->done) order.push_back(s.get());
  }
  std::stable_sort(order.begin(), order.end(), [](const Sequence* a, const Sequence* b) {
    const bool ad = a->pending() == 1, bd = b->pending() == 1;
    if (ad != bd) return ad;
    if (a->req.priority != b->req.priority) return a->req.priority > b->req.priority;
    return a->id < b->id;
  });
  size_t budget = static_cast<size_t>(options_.max_batch_tokens);
  for (Sequence* s : order) {
    if (budget == 0) break;
    if (s->done || s->preempted) continue;
    size_t n = std::min(s->pending(), budget);
    const bool slides = kv.pool().geometry().slides();
    for (;;) {
      if (kv.grow(*s, s->written + n, claimed(kv, s))) {
        budget -= n;
        plan.rows.emplace_back(s, n);
        break;
      }
      // Under a window a shorter chunk reaches over fewer blocks: halve it before preempting.
      if (slides && n > 1) {
        n = std::max<size_t>(1, n / 2);
        continue;
      }
      if (Sequence* victim = pick_victim(*s)) {
        preempt(kv, *victim, plan);
        continue;
      }
      const bool alone = std::none_of(running_.begin(), running_.end(), [&](const auto& o) {
        return o.get() != s && !o->done && !o->preempted;
      });
      if (alone) {
        const auto& g = kv.pool().geometry();
        plan.failed.emplace_back(
            s, fmt::format("the KV pool cannot hold this sequence: {} tokens need {} blocks, "
                           "the pool has {}",
                           s->written + n, g.blocks_for_sequence(s->written + n, n),
                           kv.pool().num_blocks()));
      } else {
        preempt(kv, *s, plan);  // the newest, lowest-priority sequence yields to the others
      }
      break;
    }
  }
  // A victim may have been planned before it was preempted: drop its rows.
  std::erase_if(plan.rows, [](const auto& r) { return r.first->preempted; });
  // The preempted wait at the front, oldest first; they resume from their cached blocks.
  std::vector<std::unique_ptr<Sequence>> requeue;
  for (auto& s : running_) {
    if (s->preempted && !s->done) requeue.push_back(std::move(s));
  }
  std::erase_if(running_, [](const auto& s) { return !s; });
  std::sort(requeue.begin(), requeue.end(),
            [](const auto& a, const auto& b) { return a->id > b->id; });
  for (auto& s : requeue) waiting_.push_front(std::move(s));
  return plan;
}

}  // namespace kvc::engine
