// Prompts and requests shared by the in-process serving benchmarks.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/request.h"
#include "kv/content_hash.h"
#include "model/sampler.h"

namespace kvc::bench {

using Tokens = std::vector<int32_t>;

// n random token ids of a vocabulary of n_vocab, avoiding the first 3 (special) ids.
inline Tokens random_tokens(model::Rng& rng, int n_vocab, int n) {
  Tokens t;
  for (int i = 0; i < n; ++i) t.push_back(3 + static_cast<int32_t>(rng.next() % (n_vocab - 3)));
  return t;
}

// A greedy request for prompt in namespace ns, generating exactly output tokens.
inline engine::Request make_request(const Tokens& prompt, int output, const kv::Hash256& ns) {
  engine::Request r;
  r.prompt = prompt;
  r.max_tokens = output;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  r.ns = ns;
  return r;
}

}  // namespace kvc::bench
