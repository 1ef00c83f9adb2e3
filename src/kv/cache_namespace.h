// Cache identity: the namespace a block lives in. Two blocks are shared only if everything
// that shapes their keys and values agrees: model weights and tokenizer (the model
// fingerprint), K and V dtypes, block size, tenant salt, adapter and the kernels' arithmetic.
//
// Thread-safety: pure functions over values; safe from any thread.
#pragma once

#include <string>

#include "base/dtype.h"
#include "kv/content_hash.h"
#include "kv/kv_geometry.h"

namespace kvc::kv {

struct NamespaceKey {
  Hash256 model_fingerprint{};
  DType k_dtype = DType::F16;
  DType v_dtype = DType::F16;
  int block_tokens = kDefaultBlockTokens;
  std::string tenant_salt;  // per tenant (and per request cache_salt); empty for none
  std::string adapter;      // adapter id; empty for the base model
  // The arithmetic that computes keys and values (kernels::arithmetic_identity(): instruction
  // set and kernel version): other kernels give other last bits, so their blocks are not reused.
  std::string arithmetic;
};

// The namespace hash: SHA-256 over every field of the key.
Hash256 namespace_hash(const NamespaceKey& key);

}  // namespace kvc::kv
