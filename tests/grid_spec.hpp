// tests/grid_spec.hpp — helpers of the tests of plans over neighborhood grids (tile_map_test, backward_strips_test): a
// spec bound to its length (the product of its dims, or for a 1-D spec the length after '@': "local(16)@300"), and the
// check that a plan kept every pair of the pattern exactly once.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "spattn/pattern.hpp"

namespace spattn::test {

inline BoundPattern bind_grid_spec(const std::string& spec) {
  const size_t at = spec.find('@');
  if (at != std::string::npos) return parse(spec.substr(0, at)).bind(std::stoll(spec.substr(at + 1)));
  const size_t d = spec.find("dims=(");
  int64_t n = 1;
  for (size_t i = d + 6; spec[i] != ')';) {
    char* end = nullptr;
    n *= std::strtoll(spec.c_str() + i, &end, 10);
    i = size_t(end - spec.c_str());
    while (spec[i] == ',' || spec[i] == ' ') ++i;
  }
  return parse(spec).bind(n);
}

// kept[q * Lk + k]: how many of a plan's entries keep (q, k) (pairs the pattern drops counted by the caller). Every pair
// the pattern keeps is kept once, and the plan's nnz is the pattern's.
inline void expect_kept_once(const BoundPattern& pat, const std::vector<uint8_t>& kept, int64_t plan_nnz) {
  const int64_t lq = pat.q_len(), lk = pat.k_len();
  int64_t missing = 0, twice = 0, nnz = 0;
  for (int64_t q = 0; q < lq; ++q)
    for (int64_t k = 0; k < lk; ++k) {
      const bool in = pat.contains(q, k);
      nnz += in;
      missing += in && kept[size_t(q * lk + k)] == 0;
      twice += kept[size_t(q * lk + k)] > 1;
    }
  EXPECT_EQ(missing, 0) << "kept pairs no entry keeps";
  EXPECT_EQ(twice, 0) << "pairs kept by two entries";
  EXPECT_EQ(plan_nnz, nnz);
}

}  // namespace spattn::test
