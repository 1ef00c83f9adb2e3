// Helpers shared by the engine tests: a loaded model, greedy requests, random prompts, and
// collecting a request's events.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/completion.h"
#include "engine/engine.h"
#include "model/llama_model.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "test_models.h"

namespace kvc::engine {

struct Loaded {
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<model::Tokenizer> tokenizer;
  explicit Loaded(const std::string& path)
      : model(model::LlamaModel::load(path)),
        tokenizer(std::make_unique<model::Tokenizer>(model::Tokenizer::from_gguf(model->file()))) {}
};

inline std::string model_path() {
  const std::string stories = testing::stories_model_path();
  return stories.empty() ? testing::synthetic_model_path("tiny", DType::F32) : stories;
}

using Outcome = Completion;

inline Request greedy(std::vector<int32_t> prompt, int max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  return r;
}

inline std::vector<int32_t> random_prompt(model::Rng& rng, int n_vocab, size_t n) {
  std::vector<int32_t> p = {1};
  while (p.size() < n) p.push_back(3 + static_cast<int32_t>(rng.next() % (n_vocab - 3)));
  return p;
}

}  // namespace kvc::engine
