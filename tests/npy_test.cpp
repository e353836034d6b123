// The .npy reader of `spattn run` (src/tools/npy.cpp): a header is untrusted input. Every malformed or hostile
// one is an Error naming the file and the problem, and nothing is allocated for data the file does not hold.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "tools/npy.hpp"

namespace {

using spattn::tools::read_npy;

// A version-1 .npy image: magic, header length, the header dict padded to 64 bytes, then `data`.
std::string npy(const std::string& dict, const std::string& data = "") {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string s = "\x93NUMPY\x01";
  s += '\0';
  s += char(h.size() & 0xff);
  s += char(h.size() >> 8);
  return s + h + data;
}

std::string error_of(const std::string& image) {
  std::istringstream in(image);
  try {
    read_npy(in, "x.npy");
  } catch (const spattn::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Npy, ReadsWhatItShouldAndRefusesTheRest) {
  std::istringstream ok(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1), }", std::string(8, '\0')));
  const auto a = read_npy(ok, "ok.npy");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(a.bytes.size(), 8u);

  // A 20-digit dimension used to end in "stoll".
  {
    const std::string m = error_of(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (12345678901234567890, 1), }"));
    EXPECT_NE(m.find("x.npy"), std::string::npos) << m;
    EXPECT_NE(m.find("does not fit in a signed 64-bit integer"), std::string::npos) << m;
  }
  // Dimensions whose product overflows.
  const std::string big = error_of(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }"));
  EXPECT_NE(big.find("[4294967296, 4294967296] is too large"), std::string::npos) << big;
  // A shape of 4 TB over an empty body: refused before allocating it.
  const std::string early = error_of(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }"));
  EXPECT_NE(early.find("data ends early (expected 4000000000000 bytes for shape [1000000000000], found 0)"),
            std::string::npos)
      << early;
  EXPECT_NE(error_of(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }")).find("dtype '<f8'"),
            std::string::npos);
  EXPECT_NE(error_of(npy("{'descr': '<f4', 'fortran_order': False, 'shape': 3}")).find("malformed shape"),
            std::string::npos);
  EXPECT_NE(error_of(npy("{'descr'")).find("no value for 'descr'"), std::string::npos);
  EXPECT_NE(error_of("\x93NUMPY").find("missing NUMPY magic"), std::string::npos);
}

}  // namespace
