// libFuzzer target for the GGUF reader: any input must either parse into a File whose tensors
// lie inside the input, or raise kvc::Error. Any other exception, crash or sanitizer report is a
// bug.
#include <cstddef>
#include <cstdint>

#include "base/error.h"
#include "model/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto file = kvc::gguf::File::parse({data, size}, "fuzz");
    for (const auto& [key, value] : file->metadata()) (void)value.describe();
    for (const auto& t : file->tensors()) {
      if (t.data < data || t.bytes == 0 || t.bytes > static_cast<uint64_t>(data + size - t.data)) {
        __builtin_trap();
      }
      // Touch both ends so that ASan would flag a range outside the input.
      volatile uint8_t first = t.data[0];
      volatile uint8_t last = t.data[t.bytes - 1];
      (void)first;
      (void)last;
    }
  } catch (const kvc::Error&) {
  }
  return 0;
}
