// cuda/common/empty_backend.hpp — the GPU engines' plan for an empty problem (a length of 0).
//
// With Lq = 0 there is nothing to compute; with Lk = 0 every query row has no key, so O = 0 and LSE = -inf
// (PATTERNS.md, "Attention semantics"), and every gradient is 0 whichever length is 0. No attention kernel runs
// (their grids would be empty, and the tile and CSR planners need keys): forward and backward only fill the outputs
// (cuda/common/fill.hpp), nothing at all where the outputs are empty.
#pragma once
#include <memory>
#include <string>

#include "plan/backend.hpp"

namespace spattn::cuda {

// `engine`: the engine's name for explain ("cuda_fused", "cuda_unfused"). The caller has checked its options.
std::unique_ptr<plan::Backend> make_empty_backend(const Problem& problem, int device, std::string engine);

inline bool empty_problem(const Problem& p) { return p.q_len == 0 || p.kv_len == 0; }

}  // namespace spattn::cuda
