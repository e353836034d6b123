// spattn/engine.hpp — the engines a plan runs on (PlanOptions::engine, Plan::engine; spattn/plan.hpp describes each).
// One enum for the API and the kernel table (src/plan/kernels.hpp: each row's engine). Plain, no includes beyond
// <cstdint>: the kernel files compile it.
#pragma once
#include <cstdint>

namespace spattn {

enum class Engine : uint8_t { automatic, cpu_fused, cuda_fused, cuda_unfused, reference };

}  // namespace spattn
