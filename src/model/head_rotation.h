// Rotating each head's keys and queries before keys are stored quantised.
//
// An orthogonal rotation applied to a head's query and to its keys leaves every score q . k
// unchanged, and a Walsh-Hadamard rotation spreads a key's large channels over all of the
// head's values, so the largest value of a quantisation group, which sets its step, shrinks
// against the rest (QuaRot rotates 4-bit key caches the same way). Keys are transformed by the
// unnormalised matrix H (entries +-1) and queries by H / head_dim: since H H = head_dim I,
// (H q / head_dim) . (H k) = q . k, and the power-of-two scale rounds nothing. Used where keys
// are stored quantised and the head size is a power of two; like the key centres it is fixed
// per model and arithmetic, so a token is still quantised once and cached decode stays exact.
//
// Thread-safety: pure functions.
#pragma once

namespace kvc::model {

// Whether heads of head_dim values are rotated: head_dim a power of two, at least 2.
bool rotates_heads(int head_dim);

// x holds n_heads heads of head_dim values each (rotates_heads(head_dim)): each becomes
// H x_h * scale, H the Sylvester-Hadamard matrix of order head_dim (a fast transform).
void hadamard_heads(float* x, int n_heads, int head_dim, float scale);

}  // namespace kvc::model
