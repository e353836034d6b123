#include "tools/png.hpp"

#include <fstream>

#include "spattn/error.hpp"

namespace spattn::tools {
namespace {

uint32_t crc32(const uint8_t* p, size_t n, uint32_t c = 0xffffffffu) {
  static uint32_t table[256];
  static bool init = false;
  if (!init) {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t x = i;
      for (int k = 0; k < 8; ++k) x = (x & 1) ? 0xedb88320u ^ (x >> 1) : x >> 1;
      table[i] = x;
    }
    init = true;
  }
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c;
}

void put32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(uint8_t(x >> s));
}

void chunk(std::ofstream& f, const char* type, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> buf;
  put32(buf, uint32_t(data.size()));
  buf.insert(buf.end(), type, type + 4);
  buf.insert(buf.end(), data.begin(), data.end());
  put32(buf, crc32(buf.data() + 4, buf.size() - 4) ^ 0xffffffffu);
  f.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size()));
}

}  // namespace

void write_png_gray(const std::string& path, int w, int h, const std::vector<uint8_t>& px) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error("cannot write '" + path + "'");
  f.write("\x89PNG\r\n\x1a\n", 8);
  std::vector<uint8_t> ihdr;
  put32(ihdr, uint32_t(w));
  put32(ihdr, uint32_t(h));
  ihdr.insert(ihdr.end(), {8, 0, 0, 0, 0});  // 8-bit grayscale
  chunk(f, "IHDR", ihdr);
  std::vector<uint8_t> raw;  // filter byte 0 + row
  raw.reserve(size_t(h) * (size_t(w) + 1));
  for (int y = 0; y < h; ++y) {
    raw.push_back(0);
    raw.insert(raw.end(), px.begin() + int64_t(y) * w, px.begin() + int64_t(y + 1) * w);
  }
  std::vector<uint8_t> z{0x78, 0x01};
  uint32_t a = 1, b = 0;
  for (uint8_t c : raw) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  for (size_t p = 0; p < raw.size() || p == 0;) {
    const size_t n = std::min<size_t>(65535, raw.size() - p);
    const bool last = p + n >= raw.size();
    z.push_back(last ? 1 : 0);
    z.push_back(uint8_t(n & 0xff));
    z.push_back(uint8_t(n >> 8));
    z.push_back(uint8_t(~n & 0xff));
    z.push_back(uint8_t((~n >> 8) & 0xff));
    z.insert(z.end(), raw.begin() + int64_t(p), raw.begin() + int64_t(p + n));
    p += n;
    if (last) break;
  }
  put32(z, (b << 16) | a);
  chunk(f, "IDAT", z);
  chunk(f, "IEND", {});
  if (!f) throw Error("failed writing '" + path + "'");
}

}  // namespace spattn::tools
