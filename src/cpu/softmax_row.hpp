// cpu/softmax_row.hpp — one row's softmax in fp64, as the CPU engine computes it wherever it works in fp64 (the
// backward pass, and the rows the fused kernel hands back: non-finite values, scores past fp32's range).
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace spattn::cpu {

// `s` holds a row's scores and becomes its probabilities; returns lse = log(sum of exp(s)). As dense softmax
// computes it (PATTERNS.md, "Attention semantics"): a NaN or +inf score, or scores that are all -inf, make
// every probability and the lse NaN; a -inf score otherwise weighs 0. An empty row gives lse = -inf.
inline double softmax_row(std::vector<double>& s) {
  double m = -std::numeric_limits<double>::infinity();
  for (double x : s) m = std::max(m, x);  // a NaN is skipped here and caught by the sum
  double sum = 0;
  for (double& x : s) x = std::exp(x - m), sum += x;
  for (double& x : s) x /= sum;
  return s.empty() ? m : m + std::log(sum);
}

}  // namespace spattn::cpu
