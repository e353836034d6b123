// fuzz/parse_fuzz.cpp — the spec parser and binder (spattn::parse, Pattern::bind) on arbitrary text: every input
// is a pattern or a spattn::Error, never a crash, a hang or a sanitizer report; a pattern that binds answers
// row() exactly as its predicate contains() does.
// Input: two bytes of lengths (Lq, Lk in [0, 48]), then the spec text.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.hpp"
#include "spattn/pattern.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  spattn::fuzz::Input in(data, size);
  const int64_t lq = in.byte() % 49, lk = in.byte() % 49;
  const std::string spec(reinterpret_cast<const char*>(in.rest()), in.left());
  try {
    const spattn::BoundPattern p = spattn::parse(spec).bind(lq, lk);
    std::vector<int64_t> keys;
    int64_t nnz = 0;
    for (int64_t q = 0; q < lq; ++q) {
      p.row_keys(q, keys);
      size_t i = 0;
      for (int64_t k = 0; k < lk; ++k) {
        const bool listed = i < keys.size() && keys[i] == k;
        if (listed != p.contains(q, k)) std::abort();  // row() and contains() disagree
        i += listed;
      }
      if (i != keys.size() || int64_t(keys.size()) != p.row_nnz(q)) std::abort();
      nnz += int64_t(keys.size());
    }
    if (nnz != p.nnz()) std::abort();
  } catch (const spattn::Error&) {
  }
  return 0;
}
