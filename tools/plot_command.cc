// `strata plot METRICS.jsonl -o loss.png`: the loss curve of a `strata train --metrics` file as a PNG.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/png.h"

namespace strata::tools {
namespace {

absl::Status Plot(const std::string& in, const std::string& out) {
  std::ifstream f(in);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open metrics file '", in, "'"));
  std::vector<std::pair<double, double>> pts;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("step") || !j.contains("loss") || !j["loss"].is_number()) {
      return absl::InvalidArgumentError(absl::StrCat(in, ":", n, ": not a metrics line with step and loss"));
    }
    pts.emplace_back(j["step"].get<double>(), j["loss"].get<double>());
  }
  if (pts.empty()) return absl::InvalidArgumentError(absl::StrCat("metrics file '", in, "' has no steps"));
  const int W = 900, H = 520, L = 90, R = 30, T = 30, B = 60;
  Canvas c(W, H, {255, 255, 255});
  double x0 = pts.front().first, x1 = pts.back().first, y0 = pts[0].second, y1 = y0;
  for (auto& p : pts) y0 = std::min(y0, p.second), y1 = std::max(y1, p.second);
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  auto X = [&](double x) { return L + static_cast<int>((x - x0) / (x1 - x0) * (W - L - R)); };
  auto Y = [&](double y) { return H - B - static_cast<int>((y - y0) / (y1 - y0) * (H - T - B)); };
  const Rgb axis{60, 60, 60}, grid{225, 225, 225}, curve{31, 119, 180};
  for (int i = 0; i <= 4; ++i) {
    const double y = y0 + (y1 - y0) * i / 4;
    c.Line(L, Y(y), W - R, Y(y), grid);
    c.Text(8, Y(y) - 5, absl::StrFormat("%.3f", y), axis);
    const double x = x0 + (x1 - x0) * i / 4;
    c.Text(X(x) - 10, H - B + 12, absl::StrFormat("%.0f", x), axis);
  }
  c.Line(L, T, L, H - B, axis);
  c.Line(L, H - B, W - R, H - B, axis);
  c.Text(W / 2 - 30, H - 22, "step", axis);
  c.Text(8, 8, "loss", axis);
  for (size_t i = 1; i < pts.size(); ++i) {
    c.Line(X(pts[i - 1].first), Y(pts[i - 1].second), X(pts[i].first), Y(pts[i].second), curve);
  }
  return c.WritePng(out);
}

}  // namespace

int PlotCommand(const std::vector<std::string>& args) {
  std::vector<std::string> a = args;
  for (auto& x : a) x = x == "-o" ? "--o" : x;
  auto f = Flags::Parse(a, {{"o", false, "output PNG"}, {"output", false, "output PNG"}});
  absl::Status s = f.status();
  if (s.ok()) {
    const std::string out = f->Has("o") ? f->Str("o") : f->Str("output", "loss.png");
    if (f->positional().size() != 1) {
      s = absl::InvalidArgumentError("usage: strata plot METRICS.jsonl -o loss.png");
    } else {
      s = Plot(f->positional()[0], out);
      if (s.ok()) std::printf("wrote %s (%s)\n", out.c_str(), f->positional()[0].c_str());
    }
  }
  if (!s.ok()) {
    std::fprintf(stderr, "strata plot: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace strata::tools
