// The fp16 loss scale, as DeepSpeed's (deepspeed/runtime/fp16/loss_scaler.py): static when a scale is given,
// else DynamicLossScaler's rule. Part of the step's state; checkpoints save scale(), clean_steps() and
// hysteresis_left() and Restore them.
//
// Note [Dynamic loss scale]
// DeepSpeed's update_scale(overflow), once per optimizer step, restated over the clean steps since the last
// overflow (its cur_iter - last_overflow_iter - 1, counted before this step):
//  - an overflow with hysteresis left above 1 only uses one up (the scale stays); with 1 left (or
//    hysteresis 1) it halves the scale, not below min_loss_scale, and at that minimum already DeepSpeed
//    ends the run ("Current loss scale already at minimum"): Overflow() then returns false.
//  - a clean step refills the hysteresis first when consecutive_hysteresis is set; then, when at least one
//    clean step came before it since the last overflow and their count is a multiple of loss_scale_window,
//    it doubles the scale (and refills the hysteresis without consecutive_hysteresis).
// So the scale first doubles on the (window + 1)-th clean step, and every window clean steps after that.
#pragma once

#include <algorithm>
#include <cmath>

namespace strata::optim {

struct DynamicScaleConfig {
  double initial_power = 16;   // fp16.initial_scale_power
  int window = 1000;           // fp16.loss_scale_window
  double min_scale = 1;        // fp16.min_loss_scale
  int hysteresis = 2;          // fp16.hysteresis (DeepSpeed's delayed_shift)
  bool consecutive = false;    // fp16.consecutive_hysteresis
};

class LossScaler {
 public:
  LossScaler() = default;  // no loss scaling: scale 1
  // static_scale > 0: that scale, fixed; else dynamic from 2^initial_power.
  LossScaler(double static_scale, const DynamicScaleConfig& d)
      : dynamic_(static_scale <= 0),
        scale_(static_scale > 0 ? static_cast<float>(static_scale)
                                : std::ldexp(1.0f, static_cast<int>(d.initial_power))),
        cfg_(d),
        hysteresis_left_(d.hysteresis) {}

  float scale() const { return scale_; }
  int clean_steps() const { return clean_steps_; }
  int hysteresis_left() const { return hysteresis_left_; }
  bool dynamic() const { return dynamic_; }
  void Restore(float scale, int clean_steps, int hysteresis_left) {
    scale_ = scale;
    clean_steps_ = clean_steps;
    hysteresis_left_ = hysteresis_left;
  }
  // A step skipped for a non-finite norm. False: the scale was already at its minimum (DeepSpeed ends the
  // run there); the scale is unchanged.
  bool Overflow() {
    if (!dynamic_) return true;
    if (cfg_.hysteresis != 1 && hysteresis_left_ != 1) {
      --hysteresis_left_;
    } else if (scale_ == static_cast<float>(cfg_.min_scale)) {
      return false;
    } else {
      scale_ = std::max(scale_ / 2, static_cast<float>(cfg_.min_scale));
    }
    clean_steps_ = 0;
    return true;
  }
  // A step applied.
  void CleanStep() {
    if (!dynamic_) return;
    if (cfg_.consecutive) hysteresis_left_ = cfg_.hysteresis;
    if (clean_steps_ > 0 && clean_steps_ % cfg_.window == 0) {
      if (!cfg_.consecutive) hysteresis_left_ = cfg_.hysteresis;
      scale_ *= 2;
    }
    ++clean_steps_;
  }

 private:
  bool dynamic_ = false;
  float scale_ = 1;
  DynamicScaleConfig cfg_;
  int clean_steps_ = 0;
  int hysteresis_left_ = 1;
};

}  // namespace strata::optim
