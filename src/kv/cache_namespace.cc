#include "kv/cache_namespace.h"

namespace kvc::kv {

Hash256 namespace_hash(const NamespaceKey& key) {
  Hasher h;
  h.str("kvcache-namespace-v3")
      .hash(key.model_fingerprint)
      .str(dtype_name(key.k_dtype))
      .str(dtype_name(key.v_dtype))
      .u64(static_cast<uint64_t>(key.block_tokens))
      .str(key.tenant_salt)
      .str(key.adapter)
      .str(key.arithmetic);
  // Quantised keys are stored centred (model/key_centres.h) and, where heads are a power of two
  // in size, rotated (model/head_rotation.h): blocks written before either, with the same dtype
  // names, hold other bytes. f16 and f32 keys keep their namespace.
  if (block_elements(key.k_dtype) > 1) h.str("keys-centred-rotated-1");
  return h.finish();
}

}  // namespace kvc::kv
