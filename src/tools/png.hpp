// A dependency-free grayscale PNG writer (stored deflate blocks).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spattn::tools {
void write_png_gray(const std::string& path, int width, int height, const std::vector<uint8_t>& pixels);
}
