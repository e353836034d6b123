#include "tools/npy.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <istream>

namespace spattn::tools {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

NpyArray read_npy(std::istream& f, const std::string& name) {
  auto bad = [&](const std::string& why) { return Error("'" + name + "' is not a supported .npy file: " + why); };
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw bad("missing NUMPY magic");
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    if (!f.read(reinterpret_cast<char*>(b), 2)) throw bad("truncated header");
    hlen = b[0] | (b[1] << 8);
  } else if (magic[6] == 2 || magic[6] == 3) {
    unsigned char b[4];
    if (!f.read(reinterpret_cast<char*>(b), 4)) throw bad("truncated header");
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  } else {
    throw bad("unknown version " + std::to_string(int(magic[6])));
  }
  if (hlen > (1u << 20)) throw bad("header too long");
  std::string h(hlen, '\0');
  if (!f.read(h.data(), hlen)) throw bad("truncated header");
  auto field = [&](const std::string& key) {
    const size_t p = h.find("'" + key + "'");
    if (p == std::string::npos) throw bad("header has no '" + key + "'");
    const size_t colon = h.find(':', p);
    if (colon == std::string::npos) throw bad("header has no value for '" + key + "'");
    return h.substr(colon + 1);
  };
  NpyArray a;
  std::string descr = field("descr");
  descr = descr.substr(descr.find('\'') == std::string::npos ? descr.size() : descr.find('\'') + 1);
  descr = descr.substr(0, descr.find('\''));
  if (descr == "<f4" || descr == "=f4") {
    a.dtype = DType::f32;
  } else if (descr == "<f2" || descr == "=f2") {
    a.dtype = DType::f16;
  } else {
    throw bad("dtype '" + descr + "' (use float32 or float16)");
  }
  const std::string fo = field("fortran_order");
  if (fo.find("True") < fo.find(',')) throw bad("Fortran order is not supported (save a C-contiguous array)");
  std::string sh = field("shape");
  if (sh.find('(') == std::string::npos || sh.find(')') == std::string::npos) throw bad("malformed shape");
  sh = sh.substr(sh.find('(') + 1);
  sh = sh.substr(0, sh.find(')'));
  size_t p = 0;
  while (p < sh.size()) {
    while (p < sh.size() && (sh[p] == ' ' || sh[p] == ',')) ++p;
    if (p >= sh.size()) break;
    size_t q = p;
    int64_t dim = 0;
    for (; q < sh.size() && isdigit(static_cast<unsigned char>(sh[q])); ++q)
      if (__builtin_mul_overflow(dim, 10, &dim) || __builtin_add_overflow(dim, sh[q] - '0', &dim))
        throw bad("dimension " + sh.substr(p, q + 1 - p) + "... of the shape does not fit in a signed 64-bit integer");
    if (q == p) throw bad("malformed shape");
    a.shape.push_back(dim);
    p = q;
  }
  const int64_t bytes = checked_bytes("'" + name + "': shape", a.shape, dtype_size(a.dtype));
  // What the file holds after the header, before allocating what the header claims.
  const std::istream::pos_type at = f.tellg();
  f.seekg(0, std::ios::end);
  const std::istream::pos_type end = f.tellg();
  f.seekg(at);
  const int64_t left = at >= 0 && end >= at ? int64_t(end - at) : -1;
  if (!f || (left >= 0 && left < bytes))
    throw bad("data ends early (expected " + std::to_string(bytes) + " bytes for shape " + shape_str(a.shape) + ", found " +
              std::to_string(std::max<int64_t>(left, 0)) + ")");
  a.bytes.resize(size_t(bytes));
  if (!f.read(reinterpret_cast<char*>(a.bytes.data()), bytes))
    throw bad("data ends early (expected " + std::to_string(bytes) + " bytes for shape " + shape_str(a.shape) + ")");
  return a;
}

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open '" + path + "'");
  return read_npy(f, path);
}

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) h += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
  h += "), }";
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error("cannot write '" + path + "'");
  const uint16_t hl = uint16_t(h.size());
  f.write("\x93NUMPY\x01\x00", 8);
  const char hb[2] = {char(hl & 0xff), char(hl >> 8)};
  f.write(hb, 2);
  f.write(h.data(), std::streamsize(h.size()));
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  f.write(reinterpret_cast<const char*>(data), std::streamsize(n * 4));
  if (!f) throw Error("failed writing '" + path + "'");
}

}  // namespace spattn::tools
