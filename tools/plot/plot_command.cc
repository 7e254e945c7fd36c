// `strata plot METRICS.jsonl -o loss.svg [--log-y] [--title T]`: the loss curves of a `strata train
// --metrics` file as an SVG (docs/decisions/0008-fresh-machine-plots-and-diagnostics.md): text stays text, crisp at any
// size, and nothing is encoded by hand. The training loss is a line; the evaluation loss, where lines carry
// `eval_loss`, is a second line with markers. Ticks are 1-2-5 multiples of a power of ten; on --log-y,
// the 1, 2, 5 of each decade (the decades alone when they are many). Lines may hold either loss or both.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "runtime/base/input_file.h"
#include "runtime/base/status.h"
#include "spec/flags.h"
#include "tools/cli/commands.h"

namespace strata::tools {
namespace {

using Series = std::vector<std::pair<double, double>>;  // (step, loss)

struct Metrics {
  Series train, eval;
};

// Far above a long run's JSONL (about 200 bytes a step); /dev/zero used to grow one "line" until bad_alloc.
constexpr uint64_t kMaxMetricsFileBytes = uint64_t{1} << 30;

absl::StatusOr<Metrics> ReadMetrics(const std::string& in, bool log_y) {
  STRATA_ASSIGN_OR_RETURN(const std::string text,
                          ReadInputFile(in, "metrics file", kMaxMetricsFileBytes, InputKind::kRegularFileOrFifo));
  Metrics m;
  int n = 0;
  for (const absl::string_view line : absl::StrSplit(text, '\n')) {
    ++n;
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    const bool has_loss = j.is_object() && j.contains("loss") && j["loss"].is_number();
    const bool has_eval = j.is_object() && j.contains("eval_loss") && j["eval_loss"].is_number();
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number() || (!has_loss && !has_eval)) {
      return absl::InvalidArgumentError(absl::StrCat(in, ":", n, ": not a metrics line with step and loss"));
    }
    const double step = j["step"].get<double>();
    for (auto [has, key, series] :
         {std::tuple{has_loss, "loss", &m.train}, std::tuple{has_eval, "eval_loss", &m.eval}}) {
      if (!has) continue;
      const double v = j[key].get<double>();
      if (!std::isfinite(v) || (log_y && v <= 0)) continue;  // a skipped step's loss is not a point
      series->emplace_back(step, v);
    }
  }
  if (m.train.empty() && m.eval.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("metrics file '", in, "' has no steps with a finite loss"));
  }
  return m;
}

// The 1-2-5 step that splits `span` into about `target` intervals.
double NiceStep(double span, int target) {
  const double raw = span / target, decade = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * decade >= raw) return m * decade;
  }
  return 10 * decade;
}

struct Axis {
  double lo, hi;
  bool log;
  std::vector<double> ticks;
  double Frac(double v) const {
    return log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
  }
};

// A linear axis that ends on ticks.
Axis LinearAxis(double lo, double hi, int target) {
  if (hi <= lo) hi = lo + (lo == 0 ? 1 : std::fabs(lo) * 0.1);
  const double step = NiceStep(hi - lo, target);
  Axis a{std::floor(lo / step) * step, std::ceil(hi / step) * step, false, {}};
  for (double t = a.lo; t <= a.hi + step * 1e-9; t += step) a.ticks.push_back(std::fabs(t) < step * 1e-9 ? 0 : t);
  return a;
}

// A log axis from the 1-2-5 value at or below lo to the one at or above hi.
Axis LogAxis(double lo, double hi) {
  std::vector<double> all;
  for (int e = static_cast<int>(std::floor(std::log10(lo))) - 1; e <= static_cast<int>(std::ceil(std::log10(hi)));
       ++e) {
    for (double m : {1.0, 2.0, 5.0}) all.push_back(m * std::pow(10.0, e));
  }
  size_t first = 0, last = all.size() - 1;
  while (first + 1 < all.size() && all[first + 1] <= lo * (1 + 1e-12)) ++first;
  while (last > first + 1 && all[last - 1] >= hi * (1 - 1e-12)) --last;
  Axis a{all[first], all[last], true, {}};
  const bool many = last - first > 9;  // more than three decades: label the decades only
  for (size_t i = first; i <= last; ++i) {
    if (!many || std::fabs(std::log10(all[i]) - std::round(std::log10(all[i]))) < 1e-9) a.ticks.push_back(all[i]);
  }
  return a;
}

std::string Label(double v) { return absl::StrFormat("%.6g", v); }

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    out += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : c == '"' ? "&quot;" : std::string(1, c);
  }
  return out;
}

std::string RenderSvg(const Metrics& m, const std::string& title, bool log_y) {
  const int W = 900, H = 540, L = 80, R = 30, T = 50, B = 60;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series* s : {&m.train, &m.eval}) {
    for (const auto& [x, y] : *s)
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
  }
  const Axis xa = LinearAxis(x0, x1, 8), ya = log_y ? LogAxis(y0, y1) : LinearAxis(y0, y1, 6);
  auto X = [&](double x) { return L + xa.Frac(x) * (W - L - R); };
  auto Y = [&](double y) { return H - B - ya.Frac(y) * (H - T - B); };
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "font-family=\"sans-serif\" font-size=\"13\">\n<title>%s</title>\n"
      "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n"
      "<text class=\"title\" x=\"%d\" y=\"30\" text-anchor=\"middle\" font-size=\"17\">%s</text>\n",
      W, H, W, H, Escape(title), W, H, W / 2, Escape(title));
  for (double t : xa.ticks) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e4e4e4\"/>"
                          "<text class=\"xtick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                          X(t), T, X(t), H - B, X(t), H - B + 18, Label(t));
  }
  for (double t : ya.ticks) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>"
                          "<text class=\"ytick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                          L, Y(t), W - R, Y(t), L - 8, Y(t) + 4, Label(t));
  }
  absl::StrAppendFormat(&svg,
                        "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n"
                        "<text class=\"xlabel\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n"
                        "<text class=\"ylabel\" transform=\"translate(20 %d) rotate(-90)\" text-anchor=\"middle\">"
                        "%s</text>\n",
                        L, T, W - L - R, H - T - B, (L + W - R) / 2, H - 18, (T + H - B) / 2,
                        log_y ? "loss (log scale)" : "loss");
  int legend = 0;
  for (auto [s, cls, colour, name] : {std::tuple{&m.train, "train", "#1f77b4", "training loss"},
                                      std::tuple{&m.eval, "eval", "#d62728", "evaluation loss"}}) {
    if (s->empty()) continue;
    std::string points;
    for (const auto& [x, y] : *s) absl::StrAppendFormat(&points, "%s%.2f,%.2f", points.empty() ? "" : " ", X(x), Y(y));
    absl::StrAppendFormat(&svg,
                          "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>\n",
                          cls, colour, points);
    if (s == &m.eval) {
      for (const auto& [x, y] : *s) {
        absl::StrAppendFormat(&svg, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\" fill=\"%s\"/>\n", X(x), Y(y), colour);
      }
    }
    const int ly = T + 18 + 18 * legend++;
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/>"
                          "<text class=\"legend\" x=\"%d\" y=\"%d\">%s</text>\n",
                          W - R - 150, ly, W - R - 125, ly, colour, W - R - 118, ly + 4, name);
  }
  return svg + "</svg>\n";
}

const std::vector<spec::FlagDef>& PlotFlagDefs() {
  static const auto* defs =
      new std::vector<spec::FlagDef>{{"o", false, "output SVG (also -o; default loss.svg)"},
                                     {"output", false, "the same as -o"},
                                     {"log-y", true, "logarithmic loss axis"},
                                     {"title", false, "the plot's title (default: the file's name)"}};
  return *defs;
}

absl::Status Plot(const spec::Flags& f) {
  if (f.positional().size() != 1) return absl::InvalidArgumentError(PlotUsage());
  const std::string in = f.positional()[0];
  const std::string out = f.Has("o") ? f.Str("o") : f.Str("output", "loss.svg");
  if (out.size() < 4 || out.substr(out.size() - 4) != ".svg") {
    return absl::InvalidArgumentError(absl::StrCat("the output '", out, "' must end in .svg: strata plot draws SVG "
                                                   "(rsvg-convert or a browser turns it into a PNG)"));
  }
  const bool log_y = f.Bool("log-y");
  STRATA_ASSIGN_OR_RETURN(Metrics m, ReadMetrics(in, log_y));
  const std::string title = f.Str("title", absl::StrCat("loss: ", in.substr(in.find_last_of('/') + 1)));
  std::ofstream o(out, std::ios::binary);
  o << RenderSvg(m, title, log_y);
  o.close();
  if (!o) return absl::PermissionDeniedError(absl::StrCat("cannot write '", out, "'"));
  std::printf("plot: %s (%zu training, %zu evaluation points from %s)\n", out.c_str(), m.train.size(), m.eval.size(),
              in.c_str());
  return absl::OkStatus();
}

}  // namespace

std::string PlotUsage() { return spec::Flags::Usage("plot", PlotFlagDefs(), "METRICS.jsonl"); }

int PlotCommand(const std::vector<std::string>& args) {
  std::vector<std::string> a = args;
  for (auto& x : a) x = x == "-o" ? "--o" : x;
  auto f = spec::Flags::Parse(a, PlotFlagDefs());
  const absl::Status s = f.ok() ? Plot(*f) : f.status();
  if (!s.ok()) {
    std::fprintf(stderr, "strata plot: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace strata::tools
