// Fuzzes the C ABI's unit registration (runtime/capi/capi_engine.cc: the versioned strata_param_spec
// array, read with its caller-given stride) and the unit layout behind it (runtime/shard/layout.cc).
// The fuzz bytes decode (FuzzedDataProvider) into up to four units of up to six parameter specs, laid
// out as a caller would: an array of exactly num_params elements of params[0].struct_size bytes each,
// every element's own header, name and shape pointers valid for what they claim (the ABI cannot check
// a caller that lies about its own memory); everything else is free. Each input then:
//  1. registers the units on a fresh host engine at world size 1 (in-process communicator), checks every
//     status is a clear error (never Internal, always with a message) or, when accepted, that
//     strata_engine_param_info reports the exact element counts and aligned, disjoint offsets; and
//     finalizes it when the model is small (at most 64 Ki elements), which allocates and initialises it;
//  2. lays each unit out directly (UnitLayout::Build) at a fuzzed world size 1..64 and checks the layout
//     invariants of layout.h: exact (non-wrapping) element counts, aligned increasing offsets, padding to
//     world_size x kAlignElems, and shards that cover every parameter element exactly once.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/capi/strata.h"
#include "runtime/shard/layout.h"
#include "tests/fuzz/fuzz_file.h"

namespace {

constexpr size_t kMaxUnits = 4;
constexpr size_t kMaxParams = 6;
constexpr int32_t kMaxDims = 6;
constexpr uint64_t kMaxFinalizeElems = 64 * 1024;

struct Param {
  strata_param_spec spec = STRATA_PARAM_SPEC_INIT;  // pointers filled in once every vector is final
  bool null_name = false, null_shape = false;
  std::string name;
  std::vector<int64_t> shape;
  std::vector<uint8_t> trailing;  // bytes past sizeof(strata_param_spec) inside the element
};

struct Unit {
  std::string name;
  int32_t num_params = 0;  // as passed: params.size() unless params is empty
  uint32_t stride = sizeof(strata_param_spec);
  std::vector<Param> params;
  std::vector<uint8_t> array;  // the caller's array: params.size() x stride bytes
};

int64_t Dim(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0: return in.ConsumeIntegral<int64_t>();
    case 1: return int64_t{1} << in.ConsumeIntegralInRange(0, 63);
    case 2: return in.ConsumeIntegralInRange<int64_t>(-2, 0);
    default: return in.ConsumeIntegralInRange<int64_t>(1, 40);
  }
}

Param DecodeParam(FuzzedDataProvider& in, bool first, uint32_t stride) {
  Param p;
  const uint8_t flags = in.ConsumeIntegral<uint8_t>();
  p.spec.struct_size = (!first && (flags & 0x03) == 0) ? in.ConsumeIntegralInRange<uint32_t>(0, 512) : stride;
  p.spec.version = (flags & 0x0c) == 0 ? in.ConsumeIntegral<uint32_t>() : STRATA_ABI_VERSION;
  p.null_name = (flags & 0x30) == 0x30;
  p.null_shape = (flags & 0xc0) == 0xc0;
  p.name = in.ConsumeRandomLengthString(12);
  p.spec.ndim = in.ConsumeIntegralInRange<int32_t>(-1, kMaxDims);
  for (int32_t d = 0; d < p.spec.ndim; ++d) p.shape.push_back(Dim(in));
  p.spec.weight_decay = in.ConsumeIntegral<int8_t>();
  p.spec.init = in.ConsumeIntegralInRange<int32_t>(-1, 5);
  p.spec.init_value = in.ConsumeFloatingPoint<float>();
  p.spec.has_own_lr = in.ConsumeIntegral<int8_t>();  // a param group's own values (Note [Param groups])
  p.spec.own_lr = in.ConsumeFloatingPoint<double>();
  p.spec.has_own_weight_decay = in.ConsumeIntegral<int8_t>();
  p.spec.own_weight_decay = in.ConsumeFloatingPoint<double>();
  if (stride > sizeof(strata_param_spec)) {
    p.trailing.assign(stride - sizeof(strata_param_spec), 0);
    if (in.ConsumeIntegralInRange(0, 3) == 0)
      p.trailing[in.ConsumeIntegralInRange<size_t>(0, p.trailing.size() - 1)] = 1;
  }
  return p;
}

// Decodes in place: the array points into u's strings and shapes, so u must not move afterwards.
void DecodeUnit(FuzzedDataProvider& in, Unit& u) {
  u.name = in.ConsumeRandomLengthString(12);
  switch (in.ConsumeIntegralInRange(0, 5)) {  // params[0].struct_size: a caller's struct is 8-aligned
    case 0: u.stride = 8 * in.ConsumeIntegralInRange<uint32_t>(1, sizeof(strata_param_spec) / 8); break;
    case 1: u.stride = sizeof(strata_param_spec) + 8 * in.ConsumeIntegralInRange<uint32_t>(1, 4); break;
    default: u.stride = sizeof(strata_param_spec);
  }
  const size_t count = in.ConsumeIntegralInRange<size_t>(0, kMaxParams);
  u.num_params = count > 0 ? static_cast<int32_t>(count) : in.ConsumeIntegralInRange<int32_t>(INT32_MIN, 0);
  for (size_t i = 0; i < count; ++i) u.params.push_back(DecodeParam(in, i == 0, u.stride));
  // Lay the array out now that every string and shape is in place.
  u.array.assign(count * u.stride, 0);
  for (size_t i = 0; i < count; ++i) {
    Param& p = u.params[i];
    p.spec.name = p.null_name ? nullptr : p.name.c_str();
    p.spec.shape = p.null_shape ? nullptr : p.shape.data();
    uint8_t* element = u.array.data() + i * u.stride;
    std::memcpy(element, &p.spec, std::min<size_t>(u.stride, sizeof(p.spec)));
    if (!p.trailing.empty()) std::memcpy(element + sizeof(p.spec), p.trailing.data(), p.trailing.size());
  }
}

// The element count of a shape, false when a dimension is not positive or the product needs > 64 bits.
bool ExactNumel(const std::vector<int64_t>& shape, uint64_t* numel) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *numel = n;
  return true;
}

void ExpectClearError(strata_status s, const char* call) {
  STRATA_FUZZ_EXPECT(s != STRATA_ERR_INTERNAL, "%s: %s", call, strata_last_error());
  STRATA_FUZZ_EXPECT(s == STRATA_OK || strata_last_error()[0] != '\0', "%s failed with no message", call);
}

// Registered unit `id` (decoded as `u`): param_info must report what the caller registered.
void CheckRegistered(strata_engine* e, int32_t id, const Unit& u, uint64_t* total) {
  int32_t n = 0;
  STRATA_FUZZ_EXPECT(strata_engine_num_params(e, id, &n) == STRATA_OK && n == u.num_params, "num_params");
  uint64_t end = 0;
  for (int32_t i = 0; i < n; ++i) {
    strata_param_info info = STRATA_PARAM_INFO_INIT;
    STRATA_FUZZ_EXPECT(strata_engine_param_info(e, id, i, &info) == STRATA_OK, "param_info: %s", strata_last_error());
    uint64_t exact = 0;
    const bool fits = ExactNumel(u.params[i].shape, &exact);
    STRATA_FUZZ_EXPECT(fits && info.numel == exact, "unit '%s' param %d accepted with %llu elements for its shape",
                       u.name.c_str(), i, static_cast<unsigned long long>(info.numel));
    STRATA_FUZZ_EXPECT(info.offset_elems % strata::shard::kAlignElems == 0 && info.offset_elems >= end,
                       "param %d offset %llu (previous end %llu)", i,
                       static_cast<unsigned long long>(info.offset_elems), static_cast<unsigned long long>(end));
    STRATA_FUZZ_EXPECT(!__builtin_add_overflow(info.offset_elems, info.numel, &end), "offset + numel wraps");
    STRATA_FUZZ_EXPECT(!__builtin_add_overflow(*total, exact, total), "model size wraps");
  }
}

void RunEngine(strata_comm* comm, const std::vector<Unit>& units) {
  strata_engine* e = nullptr;
  const strata_status created = strata_engine_create(comm, nullptr, &e);
  STRATA_FUZZ_EXPECT(created == STRATA_OK, "strata_engine_create: %s", strata_last_error());
  uint64_t total = 0;
  for (const Unit& u : units) {
    const auto* specs = u.params.empty() ? nullptr : reinterpret_cast<const strata_param_spec*>(u.array.data());
    int32_t id = -1;
    const strata_status s = strata_engine_register_unit(e, u.name.c_str(), specs, u.num_params, &id);
    ExpectClearError(s, "strata_engine_register_unit");
    if (s == STRATA_OK) CheckRegistered(e, id, u, &total);
  }
  if (total <= kMaxFinalizeElems) ExpectClearError(strata_engine_finalize(e), "strata_engine_finalize");
  STRATA_FUZZ_EXPECT(strata_engine_destroy(e) == STRATA_OK, "strata_engine_destroy: %s", strata_last_error());
}

void CheckLayout(const Unit& u, int world) {
  std::vector<strata::shard::ParamSpec> specs;
  for (const Param& p : u.params) {
    specs.push_back({p.name, p.shape, p.spec.weight_decay != 0, {}});
    if (p.spec.has_own_lr != 0) specs.back().own_lr = p.spec.own_lr;
    if (p.spec.has_own_weight_decay != 0) specs.back().own_weight_decay = p.spec.own_weight_decay;
  }
  auto layout = strata::shard::UnitLayout::Build(u.name, specs, world);
  if (!layout.ok()) {
    STRATA_FUZZ_EXPECT(layout.status().code() == absl::StatusCode::kInvalidArgument, "Build: %s",
                       layout.status().ToString().c_str());
    return;
  }
  const auto& l = *layout;
  size_t end = 0, numel_sum = 0;
  for (size_t i = 0; i < l.params.size(); ++i) {
    uint64_t exact = 0;
    STRATA_FUZZ_EXPECT(ExactNumel(u.params[i].shape, &exact) && l.params[i].numel == exact,
                       "Build accepted param '%s' with %zu elements for its shape", u.params[i].name.c_str(),
                       l.params[i].numel);
    STRATA_FUZZ_EXPECT(l.params[i].offset_elems % strata::shard::kAlignElems == 0 && l.params[i].offset_elems >= end,
                       "param %zu offset %zu, previous end %zu", i, l.params[i].offset_elems, end);
    STRATA_FUZZ_EXPECT(!__builtin_add_overflow(l.params[i].offset_elems, l.params[i].numel, &end), "end wraps");
    STRATA_FUZZ_EXPECT(!__builtin_add_overflow(numel_sum, l.params[i].numel, &numel_sum), "size wraps");
  }
  const size_t quantum = static_cast<size_t>(world) * strata::shard::kAlignElems;
  STRATA_FUZZ_EXPECT(l.used_elems == end && l.total_elems >= std::max<size_t>(end, 1) && l.total_elems % quantum == 0 &&
                         l.shard_elems * static_cast<size_t>(world) == l.total_elems,
                     "used %zu total %zu shard %zu world %d", l.used_elems, l.total_elems, l.shard_elems, world);
  size_t covered = 0;
  for (int r = 0; r < world; ++r) {
    for (const auto& s : l.ShardSegments(r)) covered += s.end - s.begin;
  }
  STRATA_FUZZ_EXPECT(covered == numel_sum, "shards cover %zu of %zu parameter elements", covered, numel_sum);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static strata_comm* const comm = [] {
    strata_comm* c = nullptr;
    STRATA_FUZZ_EXPECT(strata_comm_create_in_process(1, &c) == STRATA_OK, "%s", strata_last_error());
    return c;
  }();
  FuzzedDataProvider in(data, size);
  const int world = in.ConsumeIntegralInRange(1, 64);
  std::vector<Unit> units(in.ConsumeIntegralInRange<size_t>(1, kMaxUnits));
  for (Unit& u : units) DecodeUnit(in, u);  // in place: no Unit moves once decoded
  RunEngine(comm, units);
  for (const Unit& u : units) CheckLayout(u, world);
  return 0;
}
