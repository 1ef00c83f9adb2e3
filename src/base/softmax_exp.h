// The exponential of attention's softmax, and SwiGLU's gate through it, written once for scalar
// and vector code (internal to base/).
//
// Included by kernels_scalar.cc, kernels_avx2.cc and kernels_avx512.cc inside their anonymous
// namespace (the vector ones after their target pragma), like simd_reduce.h. It includes
// nothing itself. Every element takes the same operations, fused multiply-adds included, in
// scalar and in vector code, so an exponential has the same bits wherever its lane falls.
#pragma once

// exp(x) for the arguments softmax takes (x <= 0, a score minus the row's maximum): x = n ln2 + r
// with |r| <= ln2 / 2, exp(r) = 1 + r + r^2 P(r) with Cephes' minimax polynomial (under 2 ulp),
// times 2^n. Below -87 (where 2^n would leave the normal range) the result is 0; the weights
// lost there are under 2^-125 of the largest.
namespace softmax_exp {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f;
constexpr float kP1 = 1.3981999507e-3f;
constexpr float kP2 = 8.3334519073e-3f;
constexpr float kP3 = 4.1665795894e-2f;
constexpr float kP4 = 1.6666665459e-1f;
constexpr float kP5 = 5.0000001201e-1f;
constexpr float kFloor = -87.0f;

// The steps over a vector type: V provides mul, add, fma, round (to nearest even), set1,
// at_least(x, limit) (x, or limit where x is below it), scale(y, n) = y * 2^n for integral n,
// and zero_below(v, x, limit) (0 where x < limit).
template <class V>
typename V::Vec exp(typename V::Vec x) {
  // Clamped first, so that n stays an integer that scale() can take, whatever x is.
  const typename V::Vec n = V::round(V::mul(V::at_least(x, kFloor - 1.0f), V::set1(kLog2e)));
  typename V::Vec r = V::fma(n, V::set1(-kLn2Hi), x);
  r = V::fma(n, V::set1(-kLn2Lo), r);
  const typename V::Vec z = V::mul(r, r);
  typename V::Vec p = V::fma(V::set1(kP0), r, V::set1(kP1));
  p = V::fma(p, r, V::set1(kP2));
  p = V::fma(p, r, V::set1(kP3));
  p = V::fma(p, r, V::set1(kP4));
  p = V::fma(p, r, V::set1(kP5));
  const typename V::Vec y = V::add(V::fma(p, z, r), V::set1(1.0f));
  return V::zero_below(V::scale(y, n), x, kFloor);
}

// SwiGLU's gate times up, g * sigmoid(g) * u, through the same exponential, which only ever
// sees e = exp(-|g|) <= 1: sigmoid(g) = 1 / (1 + e) for g >= 0, e / (1 + e) below (0 where g <
// -87, and g itself above 87). V also provides div, min and if_nonnegative(g, a, b) (a where
// g >= 0, else b, NaN taking b).
template <class V>
typename V::Vec silu_times(typename V::Vec g, typename V::Vec u) {
  const typename V::Vec e = exp<V>(V::min(g, V::mul(g, V::set1(-1.0f))));
  const typename V::Vec s =
      V::div(V::if_nonnegative(g, V::set1(1.0f), e), V::add(e, V::set1(1.0f)));
  return V::mul(V::mul(g, s), u);
}

// The same steps on one float.
struct Scalar {
  using Vec = float;
  static float mul(float a, float b) { return a * b; }
  static float add(float a, float b) { return a + b; }
  static float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
  static float round(float a) { return __builtin_nearbyintf(a); }
  static float set1(float a) { return a; }
  static float at_least(float x, float limit) { return x > limit ? x : limit; }
  static float scale(float y, float n) {
    unsigned bits;
    __builtin_memcpy(&bits, &y, 4);
    bits += static_cast<unsigned>(static_cast<int>(n)) << 23;
    __builtin_memcpy(&y, &bits, 4);
    return y;
  }
  static float zero_below(float v, float x, float limit) { return x < limit ? 0.0f : v; }
  static float div(float a, float b) { return a / b; }
  // As minps: b where either is NaN.
  static float min(float a, float b) { return a < b ? a : b; }
  static float if_nonnegative(float g, float a, float b) { return g >= 0.0f ? a : b; }
};
}  // namespace softmax_exp
