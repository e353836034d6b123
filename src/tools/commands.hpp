// Shared pieces of the `spattn` subcommands.
#pragma once
#include <cstdint>
#include <string>

#include "spattn/tensor.hpp"

// The --impl choices for --device cpu, for help texts.
#define SPATTN_CPU_IMPLS "auto|reference"

namespace spattn::tools {

struct RunOptions {
  std::string spec;
  Problem problem;
  uint64_t seed = 0;
  std::string q_path, k_path, v_path, out_path, lse_path;
  std::string impl = "auto", device = "cpu";
  int threads = 0;
  bool verbose = true;
};

int run_attention(const RunOptions& o);
int bench_cpu_main(int argc, char** argv);

}  // namespace spattn::tools
