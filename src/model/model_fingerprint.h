// The identity of a model for cache sharing: weights, tokenizer and architecture metadata.
#pragma once

#include "kv/content_hash.h"
#include "model/gguf.h"

namespace kvc::model {

// SHA-256 over the file's whole header (every metadata key, the tokenizer and the tensor
// infos) and an XXH3-128 digest of the tensor data. Two files that differ in any weight,
// token or hyperparameter get different fingerprints.
kv::Hash256 model_fingerprint(const gguf::File& file);

}  // namespace kvc::model
