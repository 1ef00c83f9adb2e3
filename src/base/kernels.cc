#include "base/kernels.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "base/gemm_amx.h"
#include "base/gemm_table.h"
#include "base/kernel_table.h"
#include "base/prefetch_lines.h"

namespace kvc::kernels {
namespace {

bool cpu_has(Isa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return avx2_kernels() != nullptr && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case Isa::kAvx512:
      return avx512_kernels() != nullptr && cpu_has(Isa::kAvx2) &&
             __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni");
  }
  return false;
#else
  return isa == Isa::kScalar;
#endif
}

const KernelTable* table_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return avx512_kernels();
    case Isa::kAvx2:
      return avx2_kernels();
    case Isa::kScalar:
      break;
  }
  return &scalar_kernels();
}

Isa initial_isa() {
  if (const char* forced = std::getenv("KVCACHE_ISA"); forced != nullptr && *forced != 0) {
    auto isa = parse_isa(forced);
    if (!isa) fail("KVCACHE_ISA={} is not one of scalar, avx2, avx512", forced);
    if (!cpu_has(*isa)) fail("KVCACHE_ISA={}: this CPU does not support it", forced);
    return *isa;
  }
  return best_isa();
}

// Null for the scalar kernels, which compute one dot product at a time.
const GemmTable* gemm_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return avx512_gemm();
    case Isa::kAvx2:
      return avx2_gemm();
    case Isa::kScalar:
      break;
  }
  return nullptr;
}

struct Active {
  Isa isa;
  const KernelTable* table;
  const GemmTable* gemm;
  bool gemm_tiles = true;
};

Active& active() {
  static Active state = [] {
    const Isa isa = initial_isa();
    return Active{isa, table_for(isa), gemm_for(isa)};
  }();
  return state;
}

const KernelTable& table() {
  return *active().table;
}

}  // namespace

Isa best_isa() {
  if (cpu_has(Isa::kAvx512)) return Isa::kAvx512;
  if (cpu_has(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

Isa active_isa() {
  return active().isa;
}

void set_isa(Isa isa) {
  if (!cpu_has(isa)) fail("this CPU does not support the {} kernels", isa_name(isa));
  active() = Active{isa, table_for(isa), gemm_for(isa), active().gemm_tiles};
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

bool amx_active() {
  return active_isa() == Isa::kAvx512 && amx_enabled();
}

std::string kernels_name() {
  return std::string(isa_name(active_isa())) + (amx_active() ? "+amx" : "");
}

std::optional<Isa> parse_isa(std::string_view name) {
  if (name == "scalar") return Isa::kScalar;
  if (name == "avx2") return Isa::kAvx2;
  if (name == "avx512") return Isa::kAvx512;
  return std::nullopt;
}

DType activation_type(DType w) {
  if (block_elements(w) == 1) return DType::F32;
  return block_elements(w) == block_elements(DType::Q8_K) ? DType::Q8_K : DType::Q8_0;
}

size_t activation_row_bytes(DType w, size_t n) {
  return row_bytes(activation_type(w), n);
}

// Raised whenever any kernel's results change bits (2: softmax's own exponential; 3: quantised
// keys scored over their exact values, as f32 keys are; 4: AVX2's integer weight types summed
// block by block across eight weight rows; 5: SwiGLU's gate through softmax's exponential; 6:
// K-quant weights summed a super-block apart before joining a row's sum, AVX2 and AVX-512; 7:
// K-quant weights against q8_K activations, each super-block summed in integers; q5_0 weights in
// the integer tiles of q4_0, AVX2 and AVX-512; 8: AVX-512 sums q4_0, iq4_nl, q5_0, q4_1 and
// q5_1 four blocks at a time, eight products per lane; 9: AVX-512 sums q8_0 a block at a time,
// block b in lane b % 16, as its AMX tiles do).
constexpr int kArithmeticVersion = 9;

std::string arithmetic_identity() {
  return std::string(isa_name(active_isa())) + "/" + std::to_string(kArithmeticVersion);
}

void prepare_activations(DType w, const float* x, void* out, size_t n) {
  quantize(activation_type(w), x, out, n);
}

float softmax_exp(float* p, size_t n) {
  return table().softmax_exp(p, n);
}

void silu_mul(float* gate, const float* up, size_t n) {
  table().silu_mul(gate, up, n);
}

uint64_t read_sum(const uint64_t* p, size_t n, bool request_ahead) {
  return table().read_sum(p, n, request_ahead);
}

Arithmetic gemm_arithmetic(DType wtype) {
  switch (wtype) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      return Arithmetic::kF32;
    default:
      return Arithmetic::kInt8;
  }
}

uint64_t multiply_add_burst(Arithmetic kind, size_t rounds, uint64_t* checksum) {
  return table().multiply_add_burst(kind, rounds, checksum);
}

std::string_view multiply_add_instruction(Arithmetic kind) {
  return table().multiply_add_instruction(kind);
}

void quantize(DType t, const float* x, void* out, size_t n) {
  if (t == DType::Q8_0) {
    table().quantize_q8_0(x, out, n);
  } else if (t == DType::Q8_K) {
    table().quantize_q8_k(x, out, n);
  } else if (t == DType::F16) {
    table().to_f16(x, static_cast<uint16_t*>(out), n);
  } else {
    quantize_row(t, x, out, n);
  }
}

namespace {

// One weight row against one activation row. An instruction set without a single-row dot for
// a type (its GEMM tile with one row and one column is that dot) takes the tile.
float single_dot(const Active& state, DType wtype, const void* w, const void* x, size_t n) {
  if (const DotFn dot = state.table->dot[static_cast<int>(wtype)]) return dot(w, x, n);
  float y = 0.0f;
  state.gemm->gemm[static_cast<int>(wtype)](w, row_bytes(wtype, n), 1, x,
                                            activation_row_bytes(wtype, n), 1, n, &y, 1);
  return y;
}

}  // namespace

void dot_rows(DType wtype, const void* w, const void* x, size_t x_stride, int m, size_t n,
              float* out) {
  const Active& state = active();
  const auto* xb = static_cast<const uint8_t*>(x);
  for (int r = 0; r < m; ++r) out[r] = single_dot(state, wtype, w, xb + r * x_stride, n);
}

void gemm(DType wtype, const void* w, size_t w_stride, size_t n_w, const void* x, size_t x_stride,
          size_t n_x, size_t n, float* y, size_t y_stride) {
  const Active& state = active();
  if (state.gemm != nullptr && state.gemm_tiles) {
    state.gemm->gemm[static_cast<int>(wtype)](w, w_stride, n_w, x, x_stride, n_x, n, y, y_stride);
    return;
  }
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  // The loop matmul ran before the tiles: eight activation rows against one weight row.
  constexpr size_t kRowTile = 8;
  for (size_t r0 = 0; r0 < n_x; r0 += kRowTile) {
    const size_t r1 = std::min(n_x, r0 + kRowTile);
    for (size_t c = 0; c < n_w; ++c) {
      for (size_t r = r0; r < r1; ++r) {
        y[r * y_stride + c] = single_dot(state, wtype, wb + c * w_stride, xb + r * x_stride, n);
      }
    }
  }
}

void set_gemm_tiles(bool tiles) {
  active().gemm_tiles = tiles;
}

bool gemm_tiles() {
  return active().gemm_tiles;
}

float dot_f32(const float* a, const float* b, size_t n) {
  return table().dot_f32(a, b, n);
}

float dot_f16_f32(const uint16_t* a, const float* b, size_t n) {
  return table().dot_f16_f32(a, b, n);
}

void axpy_f32(float alpha, const float* x, float* y, size_t n) {
  table().axpy_f32(alpha, x, y, n);
}

void axpy_f16(float alpha, const uint16_t* x, float* y, size_t n) {
  table().axpy_f16(alpha, x, y, n);
}

void attention_scores(DType kv, const float* q, const void* k, size_t n, size_t hd, float scale,
                      float* out) {
  if (kv == DType::F16) {
    table().scores_f16(q, static_cast<const uint16_t*>(k), n, hd, scale, out);
  } else {
    table().scores_f32(q, static_cast<const float*>(k), n, hd, scale, out);
  }
}

void attention_scores_queries(DType kv, const float* const* q, size_t nq, const void* k, size_t n,
                              size_t hd, float scale, float* const* out, const void* ahead) {
  if (kv == DType::F16) {
    table().scores_f16_queries(q, nq, static_cast<const uint16_t*>(k), n, hd, scale, out,
                               static_cast<const uint16_t*>(ahead));
  } else {
    prefetch_lines(ahead, 0, n * hd * sizeof(float));
    for (size_t j = 0; j < nq; ++j) attention_scores(kv, q[j], k, n, hd, scale, out[j]);
  }
}

void attention_accumulate_queries(DType kv, const float* const* p, size_t nq, const void* v,
                                  size_t n, size_t hd, float* const* out, const void* ahead) {
  if (kv == DType::F16) {
    table().accumulate_f16_queries(p, nq, static_cast<const uint16_t*>(v), n, hd, out,
                                   static_cast<const uint16_t*>(ahead));
  } else {
    prefetch_lines(ahead, 0, n * hd * sizeof(float));
    for (size_t j = 0; j < nq; ++j) attention_accumulate(kv, p[j], v, n, hd, out[j]);
  }
}

void attention_accumulate(DType kv, const float* p, const void* v, size_t n, size_t hd,
                          float* out) {
  if (kv == DType::F16) {
    table().accumulate_f16(p, static_cast<const uint16_t*>(v), n, hd, out);
  } else {
    table().accumulate_f32(p, static_cast<const float*>(v), n, hd, out);
  }
}

}  // namespace kvc::kernels
