// The fp16 loss scale (DeepSpeed's fp16 semantics): static when a scale is given, else dynamic: a
// non-finite gradient norm halves it (not below the minimum) and `window` clean steps in a row double
// it. Part of the step's state; checkpoints save scale() and clean_steps() and Restore them.
#pragma once

#include <algorithm>
#include <cmath>

namespace strata::optim {

class LossScaler {
 public:
  LossScaler() = default;  // no loss scaling: scale 1
  // static_scale > 0: that scale, fixed; else dynamic from 2^initial_power.
  LossScaler(double static_scale, double initial_power, int window, double min_scale)
      : dynamic_(static_scale <= 0),
        scale_(static_scale > 0 ? static_cast<float>(static_scale) : std::ldexp(1.0f, static_cast<int>(initial_power))),
        window_(window),
        min_scale_(static_cast<float>(min_scale)) {}

  float scale() const { return scale_; }
  int clean_steps() const { return clean_steps_; }
  bool dynamic() const { return dynamic_; }
  void Restore(float scale, int clean_steps) {
    scale_ = scale;
    clean_steps_ = clean_steps;
  }
  // A step skipped for a non-finite norm.
  void Overflow() {
    if (!dynamic_) return;
    scale_ = std::max(scale_ / 2, min_scale_);
    clean_steps_ = 0;
  }
  // A step applied.
  void CleanStep() {
    if (dynamic_ && ++clean_steps_ >= window_) {
      scale_ *= 2;
      clean_steps_ = 0;
    }
  }

 private:
  bool dynamic_ = false;
  float scale_ = 1;
  int clean_steps_ = 0;
  int window_ = 1;
  float min_scale_ = 1;
};

}  // namespace strata::optim
