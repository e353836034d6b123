// Minimal .npy reading (float32 / float16, C order) and writing (float32).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "spattn/tensor.hpp"

namespace spattn::tools {

struct NpyArray {
  DType dtype = DType::f32;          // f32 or f16 (raw 16-bit words)
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;        // C-order data
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
};

NpyArray read_npy(const std::string& path);  // throws Error naming the file and the problem
void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace spattn::tools
