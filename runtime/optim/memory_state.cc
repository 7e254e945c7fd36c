#include "runtime/optim/memory_state.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/common/element_math.h"
#include "runtime/base/status.h"

namespace strata::optim {

std::optional<absl::Span<float>> StateStore::Lend(int, StateKind) { return std::nullopt; }

namespace {
class InPlace : public KindSnapshot {
 public:
  InPlace(const char* data, size_t elems, DType dtype) : data_(data), elems_(elems), dtype_(dtype) {}
  size_t elems() const override { return elems_; }
  absl::Status Read(size_t at, size_t n, float* dst) override {
    if (data_ == nullptr) return absl::InternalError("an in-place snapshot read after its release");
    if (at > elems_ || n > elems_ - at) {
      return absl::InternalError(absl::StrCat("in-place snapshot read [", at, ", ", at + n, ") of ", elems_));
    }
    ReadAsFloats(data_ + at * DTypeBytes(dtype_), dtype_, n, dst);
    return absl::OkStatus();
  }
  void Release() override { data_ = nullptr; }
  uint64_t held_bytes() const override { return 0; }
  uint64_t staging_bytes() const override { return 0; }
  uint64_t in_place_bytes() const override { return data_ == nullptr ? 0 : elems_ * DTypeBytes(dtype_); }

 private:
  const char* data_;
  size_t elems_;
  DType dtype_;
};
}  // namespace

void ReadAsFloats(const char* data, DType dtype, size_t n, float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, data, n * sizeof(float));
      break;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) dst[i] = kernels::Bf16ToFloat(reinterpret_cast<const uint16_t*>(data)[i]);
      break;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) dst[i] = kernels::HalfToFloat(reinterpret_cast<const uint16_t*>(data)[i]);
      break;
  }
}

std::unique_ptr<KindSnapshot> InPlaceSnapshot(const char* data, size_t elems, DType dtype) {
  return std::make_unique<InPlace>(data, elems, dtype);
}

MemoryState::MemoryState(memory::TierOps& master_ops, memory::TierOps& state_ops, TierUpdate& update, bool master_apart,
                         std::vector<MemoryUnit> units)
    : master_ops_(master_ops),
      state_ops_(state_ops),
      update_(update),
      master_apart_(master_apart),
      units_(std::move(units)) {}

float* MemoryState::Ptr(int unit, StateKind kind) {
  MemoryUnit& u = units_[unit];
  if (kind == StateKind::kMaster) return u.master_ptr;
  return kind == StateKind::kExpAvgSq ? u.v.as<float>() : u.m.as<float>();
}

absl::StatusOr<std::vector<float>> MemoryState::Read(int unit, StateKind kind) {
  std::vector<float> out(units_[unit].elems);
  STRATA_RETURN_IF_ERROR(OpsOf(kind).ToHost(out.data(), Ptr(unit, kind), out.size() * 4));
  return out;
}

absl::Status MemoryState::Write(int unit, StateKind kind, const std::vector<float>& values) {
  return OpsOf(kind).FromHost(Ptr(unit, kind), values.data(), values.size() * 4);
}

std::optional<absl::Span<float>> MemoryState::Lend(int unit, StateKind kind) {
  if (!OpsOf(kind).host_visible()) return std::nullopt;
  return absl::Span<float>(Ptr(unit, kind), units_[unit].elems);
}

absl::StatusOr<offload::TilePipelineStats> MemoryState::Step(int unit, const OptimizerConfig& cfg,
                                                              const UnitStep& up) {
  MemoryUnit& u = units_[unit];
  ShardState s{u.master_ptr, up.grad, u.m.as<float>(), u.v.as<float>()};
  // The fused pass also writes the low-precision param copy (`params`: the update range of the param
  // storage); an fp32 master kept apart is copied.
  auto update = [&](char* params) -> absl::Status {
    const bool copy = up.param_dtype != DType::kF32;
    STRATA_RETURN_IF_ERROR(update_.Update(cfg, s, *up.segments, up.groups, up.step, up.clip_coef,
                                          copy ? reinterpret_cast<uint16_t*>(params) : nullptr, up.param_dtype));
    if (!copy && master_apart_) return state_ops_.Cast(DType::kF32, s.master, params, u.elems);
    return absl::OkStatus();
  };
  // Device state updates device params in place (Note [Tier ops] in runtime/memory/tier_ops.h).
  STRATA_RETURN_IF_ERROR(state_ops_.host_visible() ? WriteParamsOnHost(up.params, update) : update(up.params.in_place));
  return offload::TilePipelineStats{};
}

}  // namespace strata::optim
