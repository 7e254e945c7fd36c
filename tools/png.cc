#include "tools/png.h"

#include <cstdlib>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"

namespace strata::tools {
namespace {

uint32_t Crc32(const uint8_t* data, size_t n, uint32_t crc = 0) {
  static uint32_t table[256] = {0};
  if (table[1] == 0) {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
  }
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

void Put32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

void Chunk(std::vector<uint8_t>& out, const char* type, const std::vector<uint8_t>& data) {
  Put32(out, static_cast<uint32_t>(data.size()));
  std::vector<uint8_t> body(type, type + 4);
  body.insert(body.end(), data.begin(), data.end());
  out.insert(out.end(), body.begin(), body.end());
  Put32(out, Crc32(body.data(), body.size()));
}

// zlib stream of stored (uncompressed) deflate blocks.
std::vector<uint8_t> ZlibStored(const std::vector<uint8_t>& raw) {
  std::vector<uint8_t> z = {0x78, 0x01};
  size_t pos = 0;
  do {
    const size_t n = std::min<size_t>(65535, raw.size() - pos);
    z.push_back(pos + n == raw.size() ? 1 : 0);
    z.push_back(n & 0xff);
    z.push_back(n >> 8);
    z.push_back(~n & 0xff);
    z.push_back((~n >> 8) & 0xff);
    z.insert(z.end(), raw.begin() + pos, raw.begin() + pos + n);
    pos += n;
  } while (pos < raw.size());
  uint32_t a = 1, b = 0;
  for (uint8_t v : raw) {
    a = (a + v) % 65521;
    b = (b + a) % 65521;
  }
  Put32(z, (b << 16) | a);
  return z;
}

// 3x5 glyphs, one row per string, '#' = ink.
const std::map<char, const char*>& Font() {
  static const std::map<char, const char*> f = {
      {'0', "###" "#.#" "#.#" "#.#" "###"}, {'1', ".#." "##." ".#." ".#." "###"}, {'2', "###" "..#" "###" "#.." "###"},
      {'3', "###" "..#" "###" "..#" "###"}, {'4', "#.#" "#.#" "###" "..#" "..#"}, {'5', "###" "#.." "###" "..#" "###"},
      {'6', "###" "#.." "###" "#.#" "###"}, {'7', "###" "..#" "..#" "..#" "..#"}, {'8', "###" "#.#" "###" "#.#" "###"},
      {'9', "###" "#.#" "###" "..#" "###"}, {'.', "..." "..." "..." "..." ".#."}, {'-', "..." "..." "###" "..." "..."},
      {'+', "..." ".#." "###" ".#." "..."}, {'e', "..." "###" "##." "#.." "###"}, {'s', "..." ".##" ".#." "..#" "##."},
      {'t', ".#." "###" ".#." ".#." ".##"}, {'p', "..." "###" "#.#" "###" "#.."}, {'l', "##." ".#." ".#." ".#." "###"},
      {'o', "..." "###" "#.#" "#.#" "###"}, {' ', "..." "..." "..." "..." "..."}};
  return f;
}

}  // namespace

Canvas::Canvas(int width, int height, Rgb bg) : w_(width), h_(height), px_(size_t(width) * height * 3) {
  for (size_t i = 0; i < px_.size(); i += 3) {
    px_[i] = bg.r;
    px_[i + 1] = bg.g;
    px_[i + 2] = bg.b;
  }
}

void Canvas::Set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
  uint8_t* p = &px_[(size_t(y) * w_ + x) * 3];
  p[0] = c.r;
  p[1] = c.g;
  p[2] = c.b;
}

void Canvas::Line(int x0, int y0, int x1, int y1, Rgb c) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  while (true) {
    Set(x0, y0, c);
    if (x0 == x1 && y0 == y1) return;
    const int e2 = 2 * err;
    if (e2 >= dy) { err += dy; x0 += sx; }
    if (e2 <= dx) { err += dx; y0 += sy; }
  }
}

void Canvas::Text(int x, int y, const std::string& s, Rgb c, int scale) {
  for (char ch : s) {
    auto it = Font().find(ch);
    if (it != Font().end()) {
      for (int r = 0; r < 5; ++r) {
        for (int q = 0; q < 3; ++q) {
          if (it->second[r * 3 + q] != '#') continue;
          for (int a = 0; a < scale; ++a) {
            for (int b = 0; b < scale; ++b) Set(x + q * scale + a, y + r * scale + b, c);
          }
        }
      }
    }
    x += 4 * scale;
  }
}

absl::Status Canvas::WritePng(const std::string& path) const {
  std::vector<uint8_t> raw;
  raw.reserve(size_t(h_) * (1 + 3 * w_));
  for (int y = 0; y < h_; ++y) {
    raw.push_back(0);  // filter: none
    raw.insert(raw.end(), px_.begin() + size_t(y) * w_ * 3, px_.begin() + size_t(y + 1) * w_ * 3);
  }
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr;
  Put32(ihdr, static_cast<uint32_t>(w_));
  Put32(ihdr, static_cast<uint32_t>(h_));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8-bit, RGB, deflate, no filter, no interlace
  Chunk(png, "IHDR", ihdr);
  Chunk(png, "IDAT", ZlibStored(raw));
  Chunk(png, "IEND", {});
  std::ofstream f(path, std::ios::binary);
  if (!f || !f.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()))) {
    return absl::PermissionDeniedError(absl::StrCat("cannot write '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace strata::tools
