#include "model/head_rotation.h"

namespace kvc::model {

bool rotates_heads(int head_dim) {
  return head_dim >= 2 && (head_dim & (head_dim - 1)) == 0;
}

void hadamard_heads(float* x, int n_heads, int head_dim, float scale) {
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    // log2(head_dim) passes of butterflies (a + b, a - b) over pairs len apart.
    for (int len = 1; len < head_dim; len *= 2) {
      for (int i = 0; i < head_dim; i += 2 * len) {
        for (int j = i; j < i + len; ++j) {
          const float a = v[j], b = v[j + len];
          v[j] = a + b;
          v[j + len] = a - b;
        }
      }
    }
    if (scale != 1.0f) {
      for (int i = 0; i < head_dim; ++i) v[i] *= scale;
    }
  }
}

}  // namespace kvc::model
