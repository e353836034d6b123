// Shared pieces of the `spattn` subcommands.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "spattn/pattern.hpp"
#include "spattn/plan.hpp"
#include "spattn/tensor.hpp"

// The --impl choices for --device cpu, for help texts.
#define SPATTN_CPU_IMPLS "auto|fused|reference"
#define SPATTN_CUDA_IMPLS "auto|fused|unfused"

namespace spattn::tools {

struct RunOptions {
  std::string spec;
  Problem problem;
  uint64_t seed = 0;
  std::string q_path, k_path, v_path, out_path, lse_path;
  std::string do_path, dq_path, dk_path, dv_path;  // the backward: dO in, the gradients out
  std::string impl = "auto", device = "cpu";
  int threads = 0;
  bool verbose = true;
  std::vector<std::string> shape_flags;  // the shape and dtype options given (checked against .npy inputs)
};

int run_attention(const RunOptions& o);
// The backward of `spattn run` (--dq / --dk / --dv): dO in, the fp32 host gradients out (dq [B, Lq, H, D],
// dk [B, Lk, HK, D], dv [B, Lk, HK, Dv]), its seconds and what ran.
struct RunBackward {
  TensorView dout;
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;
  double seconds = 0;
  std::string engine;
};
// Runs the GPU path of `spattn run` through a Plan on CUDA device 0 (inputs and outputs on the host); returns
// the forward's seconds and sets *engine to the engine and kernel that ran. With `backward`, Plan::backward runs
// after the forward, on its O and LSE.
double run_cuda(const Pattern& pattern, const Problem& problem, const TensorView& q, const TensorView& k,
                const TensorView& v, float* o, float* lse, const PlanOptions& options, std::string* engine,
                RunBackward* backward = nullptr);
// `spattn tsvd ...` (src/tools/tsvd.cpp); argv[1] is "tsvd".
int tsvd_main(int argc, char** argv);

}  // namespace spattn::tools
