// bench/bench.hpp — the benchmark drivers (the spattn_bench library), run through the `spattn` command
// (src/tools/main.cpp): `spattn bench` (CPU, --device cuda, --plan-time), `spattn dist-bench`, `spattn tsvd bench`.
// bench/ sits above the library's layers and below src/tools: it includes src/ and never src/tools.
// Each *_main takes the command's whole argv unless said otherwise and returns the process exit code.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spattn::bench {

int bench_cpu_main(int argc, char** argv);   // bench/bench_cpu.cpp
int bench_cuda_main(int argc, char** argv);  // bench/bench_cuda.cpp: argv holds the arguments after "bench"
int bench_plan_main(int argc, char** argv);  // bench/plan_time.cpp: `spattn bench --plan-time`, the GPU engine's
                                             // planning stages timed on the host
int dist_bench_main(int argc, char** argv);  // bench/dist_bench.cpp: context-parallel attention, its schedule and
                                             // simulated ranks
int tsvd_bench_main(int argc, char** argv);  // bench/tsvd_bench.cpp: `spattn tsvd bench` (the GPU); argv[1] is "tsvd"

// The standard suite of `spattn bench` at length L (bench/bench_cpu.cpp): name and spec of each case.
struct BenchCase {
  std::string name, spec;
};
std::vector<BenchCase> standard_suite(int64_t L);

}  // namespace spattn::bench
