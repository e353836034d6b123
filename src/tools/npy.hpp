// Minimal .npy reading (float32 / float16, C order) and writing (float32).
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "spattn/tensor.hpp"

namespace spattn::tools {

struct NpyArray {
  DType dtype = DType::f32;          // f32 or f16 (raw 16-bit words)
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;        // C-order data
};

NpyArray read_npy(const std::string& path);  // throws Error naming the file and the problem
NpyArray read_npy(std::istream& in, const std::string& name);  // the same from a stream (name: for errors)
void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace spattn::tools
