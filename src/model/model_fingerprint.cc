#include "model/model_fingerprint.h"

#include <xxhash.h>

namespace kvc::model {

kv::Hash256 model_fingerprint(const gguf::File& file) {
  const auto bytes = file.bytes();
  const size_t header = std::min<size_t>(file.data_offset(), bytes.size());
  // XXH3 reads the weights at memory speed; SHA-256 over its digest and the header keeps the
  // combined name collision-resistant for everything but adversarial weight files.
  const XXH128_hash_t weights = XXH3_128bits(bytes.data() + header, bytes.size() - header);
  kv::Hasher h;
  h.str("kvcache-model-v1").u64(header).bytes(bytes.data(), header);
  h.u64(weights.low64).u64(weights.high64);
  return h.finish();
}

}  // namespace kvc::model
