#include "bench/decode_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "base/byte_size.h"
#include "base/histogram.h"
#include "base/kernels.h"
#include "base/thread_pool.h"
#include "engine/completion.h"
#include "kv/memory_plan.h"
#include "model/llama_model.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

namespace kvc::bench {

namespace {
using Clock = std::chrono::steady_clock;

struct Speeds {
  double prefill = 0.0;  // prompt tokens/s
  double decode = 0.0;   // generated tokens/s after the first
};

Speeds speeds(const engine::RequestStats& s) {
  return {s.prompt_tokens / (s.prefill_ms / 1e3), (s.generated_tokens - 1) / (s.decode_ms / 1e3)};
}

// Passes over the bandwidth array per measurement: a pass takes about 25 ms.
constexpr int kProbePasses = 3;
// Seconds of each measurement of the multiply-add ceiling.
constexpr double kPeakSeconds = 0.1;
// Rounds of one burst (a few microseconds): the clock is read between bursts.
constexpr size_t kBurstRounds = 2000;
// Rows quantised for ProductBandwidth's matrix before it is copied over the rest.
constexpr size_t kProductTileRows = 256;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

ReadBandwidth::ReadBandwidth(size_t bytes) : memory_(bytes) {
  uint64_t* data = words();
  for (size_t i = 0; i < bytes / sizeof(uint64_t); ++i) data[i] = i;
}

ReadBandwidth::Rate ReadBandwidth::measure(ThreadPool& pool, int passes) {
  const size_t n = memory_.size() / sizeof(uint64_t);
  const double gb = static_cast<double>(n * sizeof(uint64_t)) / 1e9;
  Rate rate;
  std::atomic<uint64_t> sink{0};
  // Plain loads, and loads whose lines are requested ahead as decode's kernels request theirs:
  // where the hardware prefetchers stay too little ahead (Intel's server cores) the requests
  // reach more, and the limit is the faster of the two.
  for (const bool request_ahead : {false, true}) {
    double seconds = 0.0;
    for (int pass = 0; pass < passes; ++pass) {
      const auto start = Clock::now();
      // Split as the engine splits a product: each thread's range follows its measured speed.
      pool.parallel_for(n, [&](size_t begin, size_t end) {
        sink += kernels::read_sum(words() + begin, end - begin, request_ahead);
      });
      const double s = seconds_since(start);
      seconds += s;
      rate.fastest = std::max(rate.fastest, gb / s);
    }
    rate.sustained = std::max(rate.sustained, gb * passes / seconds);
  }
  // The sums feed a branch the optimiser cannot drop.
  if (sink.load() == 1) rate.sustained += 1e-9;
  return rate;
}

ProductBandwidth::ProductBandwidth(DType dtype, size_t in_dim, size_t bytes)
    : memory_(std::max(bytes, kProductTileRows * row_bytes(dtype, in_dim))) {
  const size_t stride = row_bytes(dtype, in_dim);
  weights_ = {dtype, memory_.data(), memory_.size() / stride, in_dim};
  // A tile of rows quantised from values in [-1, 1), then copied over the whole matrix: valid
  // weights of the type (no NaN or subnormal scales to slow a kernel) at a copy's cost.
  model::Rng rng(7);
  const auto value = [&] { return static_cast<float>(rng.next() % 2001) / 1000.0f - 1.0f; };
  std::vector<float> row(in_dim);
  for (size_t r = 0; r < kProductTileRows; ++r) {
    for (float& v : row) v = value();
    quantize_row(dtype, row.data(), memory_.data() + r * stride, in_dim);
  }
  const size_t tile = kProductTileRows * stride;
  for (size_t at = tile; at < weights_.out_dim * stride; at += tile) {
    std::memcpy(memory_.data() + at, memory_.data(),
                std::min(tile, weights_.out_dim * stride - at));
  }
  x_.resize(in_dim);
  for (float& v : x_) v = value();
  y_.resize(weights_.out_dim);
}

double ProductBandwidth::measure(ThreadPool& pool, int passes) {
  const double gb = static_cast<double>(weights_.out_dim * weights_.row_stride()) / 1e9;
  const auto start = Clock::now();
  for (int pass = 0; pass < passes; ++pass)
    matmul(pool, weights_, x_.data(), 1, y_.data(), scratch_);
  return gb * passes / seconds_since(start);
}

double multiply_add_peak(kernels::Arithmetic kind, int threads, double seconds) {
  ThreadPool pool(threads);
  std::vector<uint64_t> multiply_adds(threads), checksum(threads);
  const auto start = Clock::now();
  pool.run([&](int t) {
    checksum[t] = static_cast<uint64_t>(t) + 1;
    const auto begin = Clock::now();
    do {
      multiply_adds[t] += kernels::multiply_add_burst(kind, kBurstRounds, &checksum[t]);
    } while (seconds_since(begin) < seconds);
  });
  const double elapsed = seconds_since(start);
  uint64_t total = 0;
  for (int t = 0; t < threads; ++t) total += multiply_adds[t];
  // The checksums feed a branch the optimiser cannot drop.
  if (std::all_of(checksum.begin(), checksum.end(), [](uint64_t c) { return c == 0; })) ++total;
  return static_cast<double>(total) / elapsed;
}

void run_decode_bench(const DecodeBenchOptions& o, std::ostream& out) {
  ReadBandwidth bandwidth(o.bandwidth_bytes);
  out << fmt::format("KV cache: {}\n", kv::kv_dtypes_name(o.kv_k_dtype, o.kv_v_dtype));
  out << fmt::format(
      "{:<16} {:<5} {:>7} {:>10} {:>12} {:>8} {:>8} {:>14} {:>11} {:>8} {:>11} {:>8} {:>8} "
      "{:>12} {:>11} {:>9} {:>8} {:>10} {:>9}\n",
      "model", "dtype", "threads", "weights", "prefill t/s", "vs rows", "vs even", "prefill GOP/s",
      "peak GOP/s", "of peak", "decode t/s", "vs rows", "vs even", "decode GB/s", "limit GB/s",
      "of limit", "of best", "GEMV GB/s", "GEMV of");
  out.flush();
  for (const std::string& preset : o.presets) {
    for (DType dtype : o.dtypes) {
      const std::string path = o.model_path(preset, dtype);
      const auto model = model::LlamaModel::load(path, o.residency);
      const auto& c = model->config();
      const auto tokenizer = model::Tokenizer::from_gguf(model->file());
      const kv::KvGeometry g = c.kv_geometry(o.kv_k_dtype, o.kv_v_dtype, 0);
      ProductBandwidth product(dtype, static_cast<size_t>(c.n_embd), o.bandwidth_bytes);
      const size_t tokens = o.prompt_tokens + o.decode_tokens + 8;
      model::Rng rng(42);
      std::vector<int32_t> prompt(o.prompt_tokens);
      for (auto& t : prompt) t = 3 + static_cast<int32_t>(rng.next() % (c.n_vocab - 3));
      for (int threads : o.threads) {
        engine::EngineOptions eo;
        eo.kv_memory_bytes = g.blocks_for_sequence(tokens) * g.bytes_per_block();
        eo.kv_k_dtype = o.kv_k_dtype;
        eo.kv_v_dtype = o.kv_v_dtype;
        eo.threads = threads;
        eo.max_running = 1;
        eo.max_batch_tokens = o.prompt_tokens;
        eo.prefix_cache = false;
        engine::Engine engine(*model, tokenizer, eo);
        engine::Request r;
        r.sampling.temperature = 0.0f;
        r.ignore_eos = true;
        // Warm-up: fault in every weight page and size the scratch buffers.
        r.prompt.assign(prompt.begin(), prompt.begin() + 8);
        r.max_tokens = 2;
        engine::complete(engine, r);
        r.prompt = prompt;
        r.max_tokens = o.decode_tokens + 1;
        // The same request without and with the GEMM tiles, back to back in one process, so
        // that their ratio is measured under the same load.
        kernels::set_gemm_tiles(false);
        const Speeds untiled = speeds(engine::complete(engine, r).stats);
        kernels::set_gemm_tiles(true);
        // A shared machine's bandwidth moves by tens of percent from one minute to the next,
        // so each decode run is set against the bandwidth measured just before and just after
        // it, and the figures are the medians over the runs.
        std::vector<double> prefill, decode, limit, fraction, of_fastest, gemv, gemv_fraction;
        std::vector<double> prefill_vs_even, decode_vs_even;
        // The probes' own pool, whose ranges learn its threads' speeds as the engine's do.
        ThreadPool probes(threads);
        ReadBandwidth::Rate before = bandwidth.measure(probes, kProbePasses);
        // The compute ceiling is the fastest of its measurements after each run: a neighbour on
        // a shared host slows it as it slows prefill, but a ceiling is what the cores can do.
        const kernels::Arithmetic arithmetic = kernels::gemm_arithmetic(dtype);
        double peak = 0.0;
        for (int run = 0; run < o.runs; ++run) {
          // Each run beside one whose ranges split evenly (the same values), under one load.
          ThreadPool::set_learned_splits(false);
          const Speeds even = speeds(engine::complete(engine, r).stats);
          ThreadPool::set_learned_splits(true);
          const Speeds tiled = speeds(engine::complete(engine, r).stats);
          prefill_vs_even.push_back(tiled.prefill / even.prefill);
          decode_vs_even.push_back(tiled.decode / even.decode);
          peak = std::max(peak, multiply_add_peak(arithmetic, threads, kPeakSeconds));
          const ReadBandwidth::Rate after = bandwidth.measure(probes, kProbePasses);
          const double around = (before.sustained + after.sustained) / 2.0;
          const double decode_gbs = model->bytes_read_per_token() * tiled.decode / 1e9;
          prefill.push_back(tiled.prefill);
          decode.push_back(tiled.decode);
          limit.push_back(around);
          fraction.push_back(decode_gbs / around);
          of_fastest.push_back(decode_gbs / ((before.fastest + after.fastest) / 2.0));
          // The product alone, between this run's probe after and the next run's decode.
          const double gemv_gbs = product.measure(probes, kProbePasses);
          gemv.push_back(gemv_gbs);
          gemv_fraction.push_back(gemv_gbs / after.sustained);
          before = after;
        }
        const double decode_tps = quantile(decode, 0.5);
        const double prefill_tps = quantile(prefill, 0.5);
        // Two operations (a multiply and an add) per multiply-add, as FLOP/s counts them.
        const double prefill_ops = 2.0 *
                                   static_cast<double>(model->multiply_adds(0, o.prompt_tokens)) /
                                   o.prompt_tokens * prefill_tps;
        const double peak_ops = 2.0 * peak;
        out << fmt::format(
            "{:<16} {:<5} {:>7} {:>10} {:>12.1f} {:>7.2f}x {:>7.2f}x {:>14.1f} {:>11.1f} {:>8.2f} "
            "{:>11.1f} {:>7.2f}x {:>7.2f}x {:>12.1f} {:>11.1f} {:>9.2f} {:>8.2f} {:>10.1f} "
            "{:>9.2f}\n",
            preset, dtype_name(dtype), threads, format_bytes(model->weight_bytes()), prefill_tps,
            prefill_tps / untiled.prefill, quantile(prefill_vs_even, 0.5), prefill_ops / 1e9,
            peak_ops / 1e9, prefill_ops / peak_ops, decode_tps, decode_tps / untiled.decode,
            quantile(decode_vs_even, 0.5), model->bytes_read_per_token() * decode_tps / 1e9,
            quantile(limit, 0.5), quantile(fraction, 0.5), quantile(of_fastest, 0.5),
            quantile(gemv, 0.5), quantile(gemv_fraction, 0.5));
        out.flush();
      }
    }
  }
  out << fmt::format(
      "\nkernels: {}; vs rows = speed with the GEMM tiles / one dot product at a "
      "time (same results); vs even = speed with each thread's range sized by its measured speed "
      "/ with even ranges (same results), the median over the runs, each run beside its own; "
      "prefill GOP/s = the prompt's multiply-adds (matrix products, "
      "attention over the keys each position sees, the last position's logits) x 2 x prefill "
      "tokens/s / prompt tokens; peak GOP/s = the instruction set's widest multiply-add of the "
      "weight type's arithmetic ({} for the quantised types, {} for the float types) on every "
      "thread at once, with no loads, x 2, the fastest of its {} s measurements after each run; "
      "of peak = prefill over peak, the compute side of the roofline as of limit is the memory "
      "side\n",
      kernels::isa_name(kernels::active_isa()),
      kernels::multiply_add_instruction(kernels::Arithmetic::kInt8),
      kernels::multiply_add_instruction(kernels::Arithmetic::kF32), kPeakSeconds);
  out << fmt::format(
      "limit GB/s = read bandwidth of a {} array in huge pages (as the weights) with the kernels' "
      "widest loads at the same thread count (ranges sized as a product's), {} passes (all the "
      "bytes over all the time, as decode tokens/s is) with plain loads and {} with each line "
      "also requested ahead as decode's kernels request weights, the faster, measured just before "
      "and just after each decode run; of limit = "
      "weight bytes read per decoded token x decode tokens/s / that run's limit; of best = the "
      "same over the fastest pass of each measurement (this bench's limit before); every figure "
      "the median of {} runs; GEMV GB/s = the weight type's matrix product alone, one "
      "activation row against a matrix as large as that array (rows of the model's width), split "
      "over the threads as the engine splits a product, {} passes after each run's second "
      "bandwidth measurement; GEMV of = that over the measurement just before it: the kernel's "
      "own streaming against the limit, where of limit adds what a decode step spends between "
      "and beside its products\n",
      format_bytes(o.bandwidth_bytes), kProbePasses, kProbePasses, o.runs, kProbePasses);
}

}  // namespace kvc::bench
