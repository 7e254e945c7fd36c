// A per-step record of what ran where: spans (stream, kind, unit, start, end) appended by the engine
// from whichever thread runs the work. Tests assert overlap on it; the trace writer reads it.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace strata::device {

struct Span {
  std::string stream;  // "compute", "gather", "reduce", ...
  std::string kind;    // "forward", "backward", "gather", "reduce_scatter", "all_reduce", "optimizer"
  int unit = -1;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

class Timeline {
 public:
  void Add(Span span) {
    std::lock_guard<std::mutex> lock(mu_);
    if (enabled_) spans_.push_back(std::move(span));
  }
  bool enabled() {
    std::lock_guard<std::mutex> lock(mu_);
    return enabled_;
  }
  void SetEnabled(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    enabled_ = on;
  }
  std::vector<Span> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(spans_, {});
  }

 private:
  std::mutex mu_;
  bool enabled_ = false;
  std::vector<Span> spans_;
};

}  // namespace strata::device
