#include "runtime/shard/layout.h"

#include <cmath>
#include <set>
#include <utility>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/units.h"

namespace strata::shard {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t HashString(uint64_t h, const std::string& s) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;  // FNV-1a
  return SplitMix64(h);
}

// Uniform in (0, 1), 53 bits.
double Unit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

std::vector<Segment> Intersect(const std::vector<ParamSlot>& params, size_t lo, size_t hi) {
  std::vector<Segment> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t b = std::max(lo, params[i].offset_elems);
    const size_t e = std::min(hi, params[i].offset_elems + params[i].numel);
    if (b < e) out.push_back(Segment{b - lo, e - lo, static_cast<int>(i), params[i].spec.weight_decay});
  }
  return out;
}

// Shapes come from callers (the C ABI, checkpoints): a unit's element count is bounded so that every byte
// size derived from it (16 bytes per element of mixed-precision Adam state, padded, times ranks) fits 64 bits.
constexpr size_t kMaxUnitElems = size_t{1} << 48;

absl::Status TooLarge(const std::string& unit, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("unit '", unit, "': ", what, " exceeds 2^48 elements, the most a unit can hold"));
}

// Unit and parameter names are written into checkpoint manifests and shard headers (JSON) and error
// messages, so they must be text: well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates), no
// control characters, at most 1024 bytes. A name from the C ABI may hold any bytes.
absl::Status CheckName(const std::string& name, absl::string_view what) {
  if (name.size() > 1024)
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", name.size(), " bytes long; at most 1024"));
  for (size_t i = 0; i < name.size();) {
    const unsigned char c = name[i];
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = len > 0 && i + len <= name.size() && c >= 0x20 && c != 0x7f;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned char d = name[i + k];
      ok = (d >> 6) == 0x2;
      cp = (cp << 6) | (d & 0x3f);
    }
    constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kMin[len] && cp <= 0x10ffff && (cp < 0xd800 || cp > 0xdfff) && (cp < 0x80 || cp >= 0xa0);
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is not printable UTF-8 text (byte ", i, " is 0x", absl::Hex(c, absl::kZeroPad2), ")"));
    }
    i += len;
  }
  return absl::OkStatus();
}

// A parameter's own lr and weight decay (Note [Param groups] in runtime/optim/optimizer.cc): finite and >= 0,
// as torch.optim requires; an own decay only on a parameter that decays.
absl::Status CheckOwnHyper(const std::string& unit, const ParamSpec& s) {
  const std::string where = absl::StrCat("parameter '", unit, ".", s.name, "'");
  for (const auto& [value, what] : {std::pair{s.own_lr, "lr"}, std::pair{s.own_weight_decay, "weight decay"}}) {
    if (value.has_value() && !(std::isfinite(*value) && *value >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has its own ", what, " ", *value, "; it must be finite and >= 0"));
    }
  }
  if (s.own_weight_decay.has_value() && !s.weight_decay) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has its own weight decay ", *s.own_weight_decay,
                                                   " but its weight-decay flag is off (it does not "
                                                   "decay); set the flag, or give it no weight decay of its own"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<UnitLayout> UnitLayout::Build(std::string name, std::vector<ParamSpec> specs, int world_size) {
  if (name.empty()) return absl::InvalidArgumentError("a unit needs a non-empty name");
  if (absl::Status s = CheckName(name, "a unit's name"); !s.ok()) return s;
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", world_size, " is outside [1, ", kMaxWorldSize, "]"));
  }
  UnitLayout l;
  l.name = std::move(name);
  l.world_size = world_size;
  std::set<std::string> seen;
  size_t offset = 0;
  for (ParamSpec& s : specs) {
    if (s.name.empty())
      return absl::InvalidArgumentError(absl::StrCat("unit '", l.name, "' has a parameter with no name"));
    if (absl::Status st = CheckName(s.name, absl::StrCat("unit '", l.name, "': a parameter's name")); !st.ok())
      return st;
    if (!seen.insert(s.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("unit '", l.name, "' registers parameter '", s.name, "' twice"));
    }
    size_t numel = 1;
    for (int64_t d : s.shape) {
      if (d <= 0) {
        return absl::InvalidArgumentError(absl::StrCat("parameter '", l.name, ".", s.name, "' has dimension ", d,
                                                       " (shape [", absl::StrJoin(s.shape, ","), "])"));
      }
      if (__builtin_mul_overflow(numel, static_cast<size_t>(d), &numel) || numel > kMaxUnitElems) {
        return TooLarge(l.name, absl::StrCat("parameter '", s.name, "' (shape [", absl::StrJoin(s.shape, ","), "])"));
      }
    }
    if (absl::Status st = CheckOwnHyper(l.name, s); !st.ok()) return st;
    offset = RoundUp(offset, kAlignElems);
    l.params.push_back(ParamSlot{std::move(s), offset, numel});
    offset += numel;  // both terms <= kMaxUnitElems: no wrap
    if (offset > kMaxUnitElems)
      return TooLarge(l.name, absl::StrCat("the sum of its ", l.params.size(), " parameters"));
  }
  l.used_elems = offset;
  l.total_elems = RoundUp(std::max<size_t>(offset, 1), static_cast<size_t>(world_size) * kAlignElems);
  l.shard_elems = l.total_elems / static_cast<size_t>(world_size);
  return l;
}

std::vector<Segment> UnitLayout::ShardSegments(int rank) const {
  return Intersect(params, static_cast<size_t>(rank) * shard_elems, static_cast<size_t>(rank + 1) * shard_elems);
}

std::vector<Segment> UnitLayout::FullSegments() const { return Intersect(params, 0, total_elems); }

uint64_t UnitLayout::Fingerprint() const {
  uint64_t h = HashString(0xcbf29ce484222325ull, name);
  for (const ParamSlot& p : params) {
    h = HashString(h, p.spec.name);
    for (int64_t d : p.spec.shape) h = SplitMix64(h ^ static_cast<uint64_t>(d));
    h = SplitMix64(h ^ (p.spec.weight_decay ? 0x5a5a : 0xa5a5));
    if (p.spec.frozen) h = SplitMix64(h ^ 0xf207e2);  // trainable units hash as they always did
    // Own hyper-parameters (Note [Param groups]) by their bits; parameters without any hash as before.
    for (const auto& [value, tag] : {std::pair{p.spec.own_lr, 0x1a}, std::pair{p.spec.own_weight_decay, 0x3d}}) {
      if (value.has_value()) h = SplitMix64(h ^ tag ^ absl::bit_cast<uint64_t>(*value));
    }
  }
  return h;
}

std::string UnitLayout::Describe() const {
  std::vector<std::string> parts;
  for (const ParamSlot& p : params) {
    parts.push_back(
        absl::StrCat(p.spec.name, "[", absl::StrJoin(p.spec.shape, ","), "]", p.spec.weight_decay ? " decay" : "",
                     p.spec.frozen ? " frozen" : "", p.spec.own_lr ? absl::StrCat(" lr=", *p.spec.own_lr) : "",
                     p.spec.own_weight_decay ? absl::StrCat(" weight_decay=", *p.spec.own_weight_decay) : ""));
  }
  return absl::StrCat(name, ": ", absl::StrJoin(parts, ", "));
}

uint64_t ParamKey(const std::string& unit, const std::string& param) {
  return HashString(HashString(0x84222325cbf29ce4ull, unit), param);
}

float InitValue(const Init& init, uint64_t seed, uint64_t param_key, uint64_t index) {
  switch (init.kind) {
    case Init::Kind::kZeros: return 0.0f;
    case Init::Kind::kOnes: return 1.0f;
    case Init::Kind::kConstant: return init.a;
    case Init::Kind::kUniform: {
      const double u = Unit(SplitMix64(SplitMix64(seed ^ param_key) + index));
      return static_cast<float>((2.0 * u - 1.0) * init.a);
    }
    case Init::Kind::kNormal: {
      const uint64_t base = SplitMix64(seed ^ param_key) + 2 * index;
      const double u1 = Unit(SplitMix64(base)), u2 = Unit(SplitMix64(base + 1));
      return static_cast<float>(init.a * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
  }
  return 0.0f;
}

}  // namespace strata::shard
