// fuzz/fuzz_input.hpp — reads a fuzzer's bytes as a stream of small integers (zeros once they run out).
#pragma once
#include <cstddef>
#include <cstdint>

namespace spattn::fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t byte() { return p_ < end_ ? *p_++ : 0; }
  int64_t u16() { return int64_t(byte()) | int64_t(byte()) << 8; }
  // In [0, n] (n >= 0).
  int64_t upto(int64_t n) { return u16() % (n + 1); }
  const uint8_t* rest() const { return p_; }
  size_t left() const { return size_t(end_ - p_); }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace spattn::fuzz
