// The GPU half of `spattn bench`: `spattn bench --device cuda ...` lands here (built only with CUDA).
#pragma once
namespace spattn::tools {
// argv holds the arguments after "bench" (including --device cuda). Returns the process exit code.
int bench_cuda_main(int argc, char** argv);
}  // namespace spattn::tools
