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
  // Quantised keys are grouped per channel across a block (base/channel_keys.h): blocks of
  // the same dtypes stored per token by earlier versions must not be read as these.
  if (block_elements(key.k_dtype) > 1) h.str("keys-per-channel-1");
  return h.finish();
}

}  // namespace kvc::kv
