// plan/key_reach.hpp — which keys a set of query rows keeps: the keys a rank must fetch under context parallelism
// (src/dist), without enumerating the kept scores.
#pragma once
#include <vector>

#include "spattn/pattern.hpp"

namespace spattn::plan {

// The keys that any row of `rows` keeps in any of `patterns` (bound to the same lengths), as sorted disjoint
// ranges. Cost: the rows' runs (one per band row, r per random row) plus O(Lk) per distinct stride of strided runs
// (difference arrays stepped by the stride), never O(kept scores) for interval and strided runs.
IndexRanges keys_reached(const std::vector<BoundPattern>& patterns, const IndexRanges& rows);

}  // namespace spattn::plan
