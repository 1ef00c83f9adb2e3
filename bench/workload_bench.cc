#include "bench/workload_bench.h"

#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/error.h"
#include "base/histogram.h"
#include "bench/bench_requests.h"
#include "engine/engine.h"
#include "model/llama_model.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

namespace kvc::bench {

namespace {

using Clock = std::chrono::steady_clock;

struct Measured {
  double ttft_p50 = 0, ttft_p99 = 0, throughput = 0, seconds = 0;
  double last_turn_ttft_p50 = 0;  // multi-turn: TTFT of the final turn
  uint64_t cached_tokens = 0, prompt_tokens = 0, generated = 0;
};

struct Context {
  const model::LlamaModel& model;
  const model::Tokenizer& tokenizer;
  const WorkloadBenchOptions& o;
};

engine::EngineOptions engine_options(const Context& c, bool cache) {
  engine::EngineOptions e;
  e.prefix_cache = cache;
  e.threads = c.o.threads;
  e.max_running = std::max(c.o.users, c.o.sessions);
  const auto g = c.model.config().kv_geometry(e.kv_k_dtype, e.kv_v_dtype, e.block_tokens);
  // Every user's whole sequence fits at once, so the comparison is about compute, not memory.
  e.kv_memory_bytes = g.blocks_for_sequence(c.model.config().context_length) * (e.max_running + 2) *
                      g.bytes_per_block();
  return e;
}

// Submits every prompt at once and waits for all. The warm-up request (a user who came
// before) pages the weights in and, with the cache on, leaves whatever the workload shares
// cached, as it is in a service that has been running.
Measured run_batch(const Context& c, bool cache, const Tokens& warm_up,
                   const std::vector<Tokens>& prompts) {
  engine::Engine engine(c.model, c.tokenizer, engine_options(c, cache));
  const kv::Hash256 ns = engine.namespace_for("");
  engine.submit(make_request(warm_up, 1, ns))->wait_text();
  const auto start = Clock::now();
  std::vector<engine::Request> requests;
  for (const auto& p : prompts) requests.push_back(make_request(p, c.o.output_tokens, ns));
  Measured m;
  std::vector<double> ttft;
  for (auto& h : engine.submit_all(std::move(requests))) {
    h->wait_text();
    const auto s = h->stats();
    ttft.push_back(s.ttft_ms);
    m.generated += s.generated_tokens;
    m.cached_tokens += s.cached_tokens;
    m.prompt_tokens += s.prompt_tokens;
  }
  m.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  m.ttft_p50 = quantile(ttft, 0.5);
  m.ttft_p99 = quantile(ttft, 0.99);
  m.throughput = m.generated / m.seconds;
  return m;
}

// Sessions run side by side; each turn waits for the previous answer and appends it.
Measured run_multi_turn(const Context& c, bool cache) {
  engine::Engine engine(c.model, c.tokenizer, engine_options(c, cache));
  const kv::Hash256 ns = engine.namespace_for("");
  const int n_vocab = c.model.config().n_vocab;
  model::Rng rng(c.o.seed + 17);
  std::vector<Tokens> conversations;
  std::vector<std::vector<Tokens>> user_turns(c.o.sessions);
  for (int s = 0; s < c.o.sessions; ++s) {
    for (int t = 0; t < c.o.turns; ++t)
      user_turns[s].push_back(random_tokens(rng, n_vocab, c.o.turn_tokens));
  }
  engine.submit(make_request(Tokens{1, 5, 6}, 1, engine.namespace_for("warm-up")))->wait_text();
  std::vector<std::vector<double>> ttft(c.o.turns);
  std::vector<Measured> per(c.o.sessions);
  std::vector<std::thread> workers;
  std::mutex mu;
  const auto start = Clock::now();
  for (int s = 0; s < c.o.sessions; ++s) {
    workers.emplace_back([&, s] {
      Tokens conversation = {1};
      for (int t = 0; t < c.o.turns; ++t) {
        conversation.insert(conversation.end(), user_turns[s][t].begin(), user_turns[s][t].end());
        engine::Request r = make_request(conversation, c.o.output_tokens, ns);
        r.session_id = fmt::format("session-{}", s);
        auto h = engine.submit(r);
        engine::TokenEvent e;
        while (h->next(e)) {
          if (e.token >= 0) conversation.push_back(e.token);
        }
        const auto st = h->stats();
        std::lock_guard lock(mu);
        ttft[t].push_back(st.ttft_ms);
        per[s].generated += st.generated_tokens;
        per[s].cached_tokens += st.cached_tokens;
        per[s].prompt_tokens += st.prompt_tokens;
      }
    });
  }
  for (auto& w : workers) w.join();
  Measured m;
  m.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> all;
  for (const auto& turn : ttft) all.insert(all.end(), turn.begin(), turn.end());
  for (const auto& p : per) {
    m.generated += p.generated;
    m.cached_tokens += p.cached_tokens;
    m.prompt_tokens += p.prompt_tokens;
  }
  m.ttft_p50 = quantile(all, 0.5);
  m.ttft_p99 = quantile(all, 0.99);
  m.last_turn_ttft_p50 = quantile(ttft.back(), 0.5);
  m.throughput = m.generated / m.seconds;
  return m;
}

// The workload's prompts, then one more for the warm-up: another user of the same shared
// prefix, or for no-sharing an unrelated prompt.
std::vector<Tokens> prompts_for(const Context& c, const std::string& workload) {
  const int n_vocab = c.model.config().n_vocab;
  model::Rng rng(c.o.seed);
  std::vector<Tokens> prompts;
  // One prompt per user: the shared prefix, then the user's own question.
  const auto per_user = [&](const Tokens& prefix) {
    for (int u = 0; u <= c.o.users; ++u) {
      Tokens p = prefix;
      const auto q = random_tokens(rng, n_vocab, c.o.question_tokens);
      p.insert(p.end(), q.begin(), q.end());
      prompts.push_back(std::move(p));
    }
  };
  if (workload == "shared-system-prompt") {
    Tokens system = {1};
    const auto body = random_tokens(rng, n_vocab, c.o.system_prompt_tokens - 1);
    system.insert(system.end(), body.begin(), body.end());
    per_user(system);
  } else if (workload == "few-shot") {
    Tokens examples = {1};
    for (int e = 0; e < 5; ++e) {
      const auto ex = random_tokens(rng, n_vocab, 80);
      examples.insert(examples.end(), ex.begin(), ex.end());
    }
    per_user(examples);
  } else if (workload == "no-sharing") {
    for (int u = 0; u <= c.o.users; ++u) {
      Tokens p = {1};
      const auto body = random_tokens(rng, n_vocab, 400);
      p.insert(p.end(), body.begin(), body.end());
      prompts.push_back(std::move(p));
    }
  } else {
    fail("unknown workload '{}' (shared-system-prompt, multi-turn, few-shot, no-sharing)",
         workload);
  }
  return prompts;
}

}  // namespace

void run_workload_bench(const WorkloadBenchOptions& o, std::ostream& out) {
  const auto model = model::LlamaModel::load(o.model_path);
  const auto tokenizer = model::Tokenizer::from_gguf(model->file());
  const Context c{*model, tokenizer, o};
  if (o.system_prompt_tokens + o.question_tokens + o.output_tokens >=
          model->config().context_length ||
      o.turns * (o.turn_tokens + o.output_tokens) + 1 >= model->config().context_length) {
    fail("the workload does not fit the model's context of {} tokens",
         model->config().context_length);
  }
  if (!o.json) {
    out << fmt::format(
        "workloads on {} ({} threads, greedy, {} output tokens per request; each run starts "
        "with one warm-up request)\n",
        o.model_path, o.threads, o.output_tokens);
    out << fmt::format("{:<22} {:>5} {:>11} {:>11} {:>11} {:>10} {:>14}\n", "workload", "cache",
                       "TTFT p50 ms", "TTFT p99 ms", "output t/s", "wall s", "cached/prompt");
  }
  for (const std::string& w : o.workloads) {
    Measured on, off;
    if (w == "multi-turn") {
      on = run_multi_turn(c, true);
      off = run_multi_turn(c, false);
    } else {
      auto prompts = prompts_for(c, w);
      const Tokens warm_up = prompts.back();
      prompts.pop_back();
      on = run_batch(c, true, warm_up, prompts);
      off = run_batch(c, false, warm_up, prompts);
    }
    if (o.json) {
      const auto side = [&](const Measured& m) {
        nlohmann::json j = {{"ttft_p50_ms", m.ttft_p50},
                            {"ttft_p99_ms", m.ttft_p99},
                            {"throughput_tokens_per_s", m.throughput},
                            {"cached_tokens", m.cached_tokens},
                            {"prompt_tokens", m.prompt_tokens},
                            {"seconds", m.seconds}};
        if (w == "multi-turn") j["last_turn_ttft_p50_ms"] = m.last_turn_ttft_p50;
        return j;
      };
      out << nlohmann::json{{"workload", w},
                            {"model", o.model_path},
                            {"cache_on", side(on)},
                            {"cache_off", side(off)},
                            {"ttft_p50_ratio", off.ttft_p50 / on.ttft_p50},
                            {"throughput_ratio", on.throughput / off.throughput}}
                 .dump()
          << "\n";
      continue;
    }
    for (const auto& [label, m] : {std::pair{"on", on}, std::pair{"off", off}}) {
      out << fmt::format("{:<22} {:>5} {:>11.1f} {:>11.1f} {:>11.1f} {:>10.2f} {:>14}\n", w, label,
                         m.ttft_p50, m.ttft_p99, m.throughput, m.seconds,
                         fmt::format("{}/{}", m.cached_tokens, m.prompt_tokens));
    }
    out << fmt::format("{:<22}       TTFT p50 {:.1f}x better, p99 {:.1f}x, throughput {:.2f}x", "",
                       off.ttft_p50 / on.ttft_p50, off.ttft_p99 / on.ttft_p99,
                       on.throughput / off.throughput);
    if (w == "multi-turn") {
      out << fmt::format(", last-turn TTFT {:.1f}x",
                         off.last_turn_ttft_p50 / on.last_turn_ttft_p50);
    }
    out << "\n";
    out.flush();
  }
}

}  // namespace kvc::bench
