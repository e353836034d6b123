// fuzz/npy_fuzz.cpp — the .npy reader of `spattn run` (src/tools/npy.cpp) on arbitrary bytes: an array or a
// spattn::Error, and never an allocation larger than the input holds.
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "tools/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const spattn::tools::NpyArray a = spattn::tools::read_npy(in, "fuzz.npy");
    if (a.bytes.size() > size) std::abort();
  } catch (const spattn::Error&) {
  }
  return 0;
}
