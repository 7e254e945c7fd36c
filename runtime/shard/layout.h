// Unit layout math (docs/design.md "Units and flat buffers").
//
// A unit's parameters are packed into one flat buffer in registration order; each parameter starts at
// a multiple of kAlignElems and the total is padded to a multiple of world_size * kAlignElems, so rank r
// owns the contiguous slice [r * shard_elems, (r + 1) * shard_elems). Padding elements are zero and never
// updated. Everything here is pure index math, shared by every stage, back-end and the checkpoint code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::shard {

inline constexpr size_t kAlignElems = 16;  // 64 bytes of fp32, 32 bytes of bf16
// The most ranks a layout is built for (the C ABI refuses a larger in-process group before allocating it).
inline constexpr int kMaxWorldSize = 1 << 20;

struct Init {
  enum class Kind { kZeros, kOnes, kConstant, kNormal, kUniform };
  Kind kind = Kind::kZeros;
  float a = 0;  // constant value, normal std, or uniform half-width
  static Init Zeros() { return {Kind::kZeros, 0}; }
  static Init Ones() { return {Kind::kOnes, 1}; }
  static Init Constant(float v) { return {Kind::kConstant, v}; }
  static Init Normal(float std) { return {Kind::kNormal, std}; }
  static Init Uniform(float half_width) { return {Kind::kUniform, half_width}; }
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool weight_decay = false;
  Init init;
  // Frozen (fine-tuning, adapters): gathered and checkpointed like any parameter, never reduced or
  // updated, with no gradient or optimizer state (Note [Frozen units] in engine/placement.h). A unit's
  // parameters are all frozen or all trainable.
  bool frozen = false;
  // The parameter's own hyper-parameters, a torch param group's, where they differ from the config's
  // (Note [Param groups] in runtime/optim/optimizer.cc): unset = the config's. own_weight_decay is the
  // decay coefficient of a parameter whose weight_decay flag is set (a parameter that does not decay has
  // no own decay). Both finite and >= 0.
  std::optional<double> own_lr;
  std::optional<double> own_weight_decay;
};

struct ParamSlot {
  ParamSpec spec;
  size_t offset_elems = 0;  // start in the unit's flat buffer
  size_t numel = 0;
};

// A run of the shard [begin, end) (relative to the shard start) inside one parameter.
struct Segment {
  size_t begin = 0;
  size_t end = 0;
  int param = -1;
  bool weight_decay = false;
  // The optimizer step of this parameter when it is not the update's own (0: the update's): a parameter
  // whose updates were skipped (Note [Parameters without a gradient], engine_step.cc) counts its own steps,
  // as torch.optim does per parameter.
  int64_t step = 0;
  // The parameter's param group: the index of its coefficients in the update's optim::GroupHypers (0: the
  // config's). The engine numbers the groups (Note [Param groups]); the layout leaves 0.
  int group = 0;
};

struct UnitLayout {
  std::string name;
  std::vector<ParamSlot> params;
  size_t used_elems = 0;   // end of the last parameter
  size_t total_elems = 0;  // padded: world_size * shard_elems
  size_t shard_elems = 0;
  int world_size = 1;

  // Validates names (non-empty, unique) and shapes (positive dims), then lays out.
  static absl::StatusOr<UnitLayout> Build(std::string name, std::vector<ParamSpec> specs, int world_size);

  // The parameter runs inside [rank * shard_elems, (rank + 1) * shard_elems), padding excluded.
  std::vector<Segment> ShardSegments(int rank) const;
  // Parameter runs of the whole buffer (stage 0 updates everything).
  std::vector<Segment> FullSegments() const;

  // Whether the unit's parameters are frozen (Build refuses nothing here; the engine refuses a unit that
  // mixes frozen and trainable parameters): its first parameter's flag.
  bool frozen() const { return !params.empty() && params[0].spec.frozen; }

  // A hash of the name, parameter names, shapes, weight-decay and frozen flags and own hyper-parameters:
  // equal on every rank or the registrations differ. Independent of world size.
  uint64_t Fingerprint() const;
  // "block1: w[64,64] decay, b[64] lr=0.01" for error messages.
  std::string Describe() const;
};

// Deterministic, world-size-independent initial value of element `index` of a parameter.
float InitValue(const Init& init, uint64_t seed, uint64_t param_key, uint64_t index);
// A stable key per (unit, param) name pair for InitValue.
uint64_t ParamKey(const std::string& unit, const std::string& param);

}  // namespace strata::shard
