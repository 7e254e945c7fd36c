// A minimal PNG encoder (8-bit RGB, uncompressed deflate blocks) and a small canvas to draw plots on,
// so `strata plot` needs no plotting library.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace strata::tools {

struct Rgb {
  uint8_t r, g, b;
};

class Canvas {
 public:
  Canvas(int width, int height, Rgb background);
  void Set(int x, int y, Rgb c);
  void Line(int x0, int y0, int x1, int y1, Rgb c);
  // Digits, '.', '-', '+', 'e' and a few lower-case letters in a 3x5 font scaled by `scale`.
  void Text(int x, int y, const std::string& s, Rgb c, int scale = 2);
  absl::Status WritePng(const std::string& path) const;
  int width() const { return w_; }
  int height() const { return h_; }

 private:
  int w_, h_;
  std::vector<uint8_t> px_;  // RGB rows
};

}  // namespace strata::tools
