// Per-channel centres subtracted from keys before they are stored quantised.
//
// Softmax does not change when every score of a query moves by one constant. Storing k - c
// for a vector c fixed per (layer, KV channel) moves each score q . k by q . c, the same for
// every key a query reads, so attention's result is unchanged in exact arithmetic. Keys carry
// large per-channel offsets (stories260K's slowest rotary pair sits near +10 where the other
// channels run about +-2; large models have their "massive" channels), and a q8_0/q4_0 group's
// step is set by its largest value: removing the offsets shrinks every group's step, so each
// key is stored with less rounding (SageAttention smooths keys for int8 attention the same
// way, with a per-sequence mean; a fixed one keeps cached blocks valid).
//
// The centres are the keys' mean over one calibration pass of pseudo-random tokens, run once
// per model with f32 keys: they depend only on the model file and the kernels' arithmetic
// (both part of the cache identity), so a token is still quantised once and its stored bytes
// never change. Where attention soft-caps its scores (gemma2) the shift would change the
// result, so no centres are used there.
//
// Thread-safety: calibrate_key_centres runs forward passes; the result is an immutable value.
#pragma once

#include <vector>

#include "base/thread_pool.h"

namespace kvc::model {

class LlamaModel;

// Tokens of the calibration pass (fewer when the model's context is shorter).
inline constexpr int kKeyCentreTokens = 256;

struct KeyCentres {
  // Per layer, kv_dim values (KV head after KV head); empty when keys are not centred.
  std::vector<std::vector<float>> per_layer;
};

// The keys' per-channel mean over positions 1.. of a calibration pass of pseudo-random tokens
// (position 0, the sequence's first token, is an outlier in many models and is left out);
// empty where the model soft-caps attention scores.
KeyCentres calibrate_key_centres(const LlamaModel& model, ThreadPool& threads);

}  // namespace kvc::model
