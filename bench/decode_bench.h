// `kvcache bench`: prefill and decode speed of synthetic models, measured side by side with
// this machine's memory bandwidth, so decode is reported as a fraction of its limit.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/huge_page_memory.h"
#include "base/kernels.h"
#include "base/matmul.h"
#include "model/gguf.h"

namespace kvc::bench {

struct DecodeBenchOptions {
  std::vector<std::string> presets = {"110m", "tinyllama-1.1b"};
  std::vector<DType> dtypes = {DType::F32, DType::F16, DType::Q8_0};
  std::vector<int> threads = {1, 2};
  DType kv_k_dtype = DType::F16;  // KV storage of keys and values
  DType kv_v_dtype = DType::F16;
  int prompt_tokens = 128;
  int decode_tokens = 32;
  int runs = 3;  // decode runs per row, each between two bandwidth measurements
  size_t bandwidth_bytes = size_t{1} << 30;              // array read to measure bandwidth
  gguf::Residency residency = gguf::Residency::kLoaded;  // how each model file is held
  // Returns the path of the synthetic model (preset, dtype), writing it if needed.
  std::function<std::string(const std::string&, DType)> model_path;
};

// This machine's memory read bandwidth, measured by summing an array well above the caches.
class ReadBandwidth {
 public:
  // Allocates and fills the array of `bytes`.
  explicit ReadBandwidth(size_t bytes);
  // GB/s of `passes` reads of the whole array split over the pool's threads, with plain loads and
  // again with requests ahead (kernels::read_sum): sustained (all the bytes over all the time, as
  // decode's tokens/s is) of the faster way, and of the fastest pass.
  struct Rate {
    double sustained = 0.0;
    double fastest = 0.0;
  };
  Rate measure(ThreadPool& pool, int passes);

 private:
  // The same memory as the weights (huge pages), so that both stream alike.
  HugePageMemory memory_;
  uint64_t* words() { return reinterpret_cast<uint64_t*>(memory_.data()); }
};

// The matrix product decode runs, alone: one activation row against a weight matrix as large
// as the bandwidth array, split over the threads as the engine splits a product, so that the
// kernel's own streaming rate stands beside the limit and the model's: what a decode step loses
// between its products (and to attention) against what the kernel loses to the memory.
class ProductBandwidth {
 public:
  // Allocates rows of in_dim values of dtype, about `bytes` of them, filled with valid weights.
  ProductBandwidth(DType dtype, size_t in_dim, size_t bytes);
  // GB/s of `passes` products over the whole matrix on the pool's threads: all the bytes over
  // all the time, as ReadBandwidth's sustained rate.
  double measure(ThreadPool& pool, int passes);

 private:
  HugePageMemory memory_;
  WeightView weights_;
  std::vector<float> x_;
  std::vector<float> y_;
  std::vector<uint8_t> scratch_;
};

// Multiply-adds per second of `kind` on `threads` threads at once, each running the active
// instruction set's widest multiply-add for it, with no loads, for about `seconds`: the
// compute ceiling prefill is set against, as decode is against ReadBandwidth.
double multiply_add_peak(kernels::Arithmetic kind, int threads, double seconds);

// Runs every (preset, dtype, threads) combination and prints a table to out.
void run_decode_bench(const DecodeBenchOptions& options, std::ostream& out);

}  // namespace kvc::bench
