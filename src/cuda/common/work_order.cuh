// cuda/common/work_order.cuh — a launch's work item by its index: the plan's tiles x batch-and-head units in head
// sections (plan::head_section, which sets the section size).
#pragma once
#include <cstdint>

namespace spattn::cuda {

struct WorkItem {
  int tile;  // the plan's tile (order[...]: query tiles in the forward, key tiles in the backward)
  int unit;  // the batch-and-head unit (b * heads + h)
};

// Work item w of `tiles` x `units`: section by section (`section` consecutive units each; the last may hold fewer;
// 0 one section of all), within a section by rank in `order` (the plan's order: most work first), units fastest.
__device__ __forceinline__ WorkItem section_item(int w, int tiles, int units, int section, const int32_t* order) {
  if (section <= 0 || section >= units) return {order[w / units], w % units};
  const int per = tiles * section;  // items of a whole section
  const int s = w / per, r = w - s * per;
  const int n = min(section, units - s * section);
  return {order[r / n], s * section + r % n};
}

}  // namespace spattn::cuda
