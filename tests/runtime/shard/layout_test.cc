#include "runtime/shard/layout.h"

#include <cmath>

#include "gtest/gtest.h"

namespace strata::shard {
namespace {

std::vector<ParamSpec> Specs() {
  return {ParamSpec{"w", {5, 3}, true, Init::Normal(1.0f)}, ParamSpec{"b", {5}, false, Init::Zeros()},
          ParamSpec{"g", {1}, false, Init::Ones()}};
}

TEST(UnitLayout, AlignsEveryParamAndPadsToWorldTimesAlignment) {
  for (int world : {1, 2, 3, 4, 7}) {
    auto l = UnitLayout::Build("u", Specs(), world);
    ASSERT_TRUE(l.ok()) << l.status();
    ASSERT_EQ(l->params.size(), 3u);
    EXPECT_EQ(l->params[0].offset_elems, 0u);
    EXPECT_EQ(l->params[1].offset_elems, 16u);  // 15 rounded up to 16
    EXPECT_EQ(l->params[2].offset_elems, 32u);
    EXPECT_EQ(l->used_elems, 33u);
    EXPECT_EQ(l->total_elems % (world * kAlignElems), 0u) << "world " << world;
    EXPECT_GE(l->total_elems, l->used_elems);
    EXPECT_LT(l->total_elems - l->used_elems, world * kAlignElems);
    EXPECT_EQ(l->shard_elems * world, l->total_elems);
  }
}

TEST(UnitLayout, ShardSegmentsCoverEveryParamElementExactlyOnce) {
  for (int world : {1, 2, 3, 5}) {
    auto l = UnitLayout::Build("u", Specs(), world);
    ASSERT_TRUE(l.ok());
    std::vector<int> hits(l->total_elems, 0);
    for (int r = 0; r < world; ++r) {
      for (const Segment& s : l->ShardSegments(r)) {
        ASSERT_LT(s.begin, s.end);
        ASSERT_LE(s.end, l->shard_elems);
        EXPECT_EQ(s.weight_decay, l->params[s.param].spec.weight_decay);
        for (size_t i = s.begin; i < s.end; ++i) ++hits[r * l->shard_elems + i];
      }
    }
    for (size_t j = 0; j < l->total_elems; ++j) {
      bool in_param = false;
      for (const auto& p : l->params) in_param |= j >= p.offset_elems && j < p.offset_elems + p.numel;
      EXPECT_EQ(hits[j], in_param ? 1 : 0) << "world " << world << " element " << j;
    }
  }
}

TEST(UnitLayout, RejectsBadSpecsWithNamedErrors) {
  auto dup = UnitLayout::Build("u", {ParamSpec{"w", {2}}, ParamSpec{"w", {3}}}, 2);
  EXPECT_NE(dup.status().message().find("'w' twice"), absl::string_view::npos) << dup.status();
  auto zero = UnitLayout::Build("u", {ParamSpec{"w", {2, 0}}}, 2);
  EXPECT_NE(zero.status().message().find("u.w"), absl::string_view::npos) << zero.status();
  EXPECT_FALSE(UnitLayout::Build("", {ParamSpec{"w", {2}}}, 1).ok());
  EXPECT_FALSE(UnitLayout::Build("u", {ParamSpec{"", {2}}}, 1).ok());
}

TEST(UnitLayout, FingerprintSeesNamesShapesAndDecayButNotWorldSize) {
  const uint64_t base = UnitLayout::Build("u", Specs(), 2)->Fingerprint();
  EXPECT_EQ(base, UnitLayout::Build("u", Specs(), 5)->Fingerprint());
  auto changed = Specs();
  changed[0].shape = {3, 5};
  EXPECT_NE(base, UnitLayout::Build("u", changed, 2)->Fingerprint());
  changed = Specs();
  changed[1].weight_decay = true;
  EXPECT_NE(base, UnitLayout::Build("u", changed, 2)->Fingerprint());
  changed = Specs();
  changed[2].name = "gamma";
  EXPECT_NE(base, UnitLayout::Build("u", changed, 2)->Fingerprint());
  EXPECT_NE(base, UnitLayout::Build("v", Specs(), 2)->Fingerprint());
  // A frozen unit differs from the same unit trainable, so ranks that disagree on it fail at Finalize.
  changed = Specs();
  for (ParamSpec& s : changed) s.frozen = true;
  auto frozen = UnitLayout::Build("u", changed, 2);
  EXPECT_NE(base, frozen->Fingerprint());
  EXPECT_TRUE(frozen->frozen());
  EXPECT_FALSE(UnitLayout::Build("u", Specs(), 2)->frozen());
}

// Note [Param groups]: a parameter's own lr and weight decay are part of the fingerprint (ranks that register
// other values fail at Finalize), are checked (finite, >= 0; an own decay only where the parameter decays),
// and reach no segment: the engine numbers the groups (Segment::group stays 0 here).
TEST(UnitLayout, OwnLrAndWeightDecayAreFingerprintedAndChecked) {
  const uint64_t base = UnitLayout::Build("u", Specs(), 2)->Fingerprint();
  auto changed = Specs();
  changed[0].own_lr = 1e-3;
  const uint64_t with_lr = UnitLayout::Build("u", changed, 2)->Fingerprint();
  EXPECT_NE(base, with_lr);
  changed[0].own_lr = 2e-3;
  EXPECT_NE(with_lr, UnitLayout::Build("u", changed, 2)->Fingerprint());
  changed = Specs();
  changed[0].own_weight_decay = 1e-3;  // the same number as an own decay is another registration
  EXPECT_NE(with_lr, UnitLayout::Build("u", changed, 2)->Fingerprint());
  EXPECT_NE(base, UnitLayout::Build("u", changed, 2)->Fingerprint());
  auto l = UnitLayout::Build("u", changed, 2);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_NE(l->Describe().find("w[5,3] decay weight_decay=0.001"), std::string::npos) << l->Describe();
  for (const Segment& s : l->ShardSegments(0)) EXPECT_EQ(s.group, 0);

  auto bad = Specs();
  bad[1].own_weight_decay = 0.1;  // b does not decay
  auto no_decay = UnitLayout::Build("u", bad, 1);
  EXPECT_NE(no_decay.status().message().find("parameter 'u.b' has its own weight decay 0.1 but its weight-decay "
                                             "flag is off"),
            absl::string_view::npos)
      << no_decay.status();
  for (const double v : {-1.0, double{NAN}, double{INFINITY}}) {
    bad = Specs();
    bad[0].own_lr = v;
    auto r = UnitLayout::Build("u", bad, 1);
    EXPECT_NE(r.status().message().find("parameter 'u.w' has its own lr"), absl::string_view::npos) << r.status();
    bad = Specs();
    bad[0].own_weight_decay = v;
    r = UnitLayout::Build("u", bad, 1);
    EXPECT_NE(r.status().message().find("its own weight decay"), absl::string_view::npos) << r.status();
  }
}

TEST(InitValue, DeterministicAndIndependentOfEverythingButItsKey) {
  const uint64_t k = ParamKey("u", "w");
  EXPECT_NE(k, ParamKey("u", "b"));
  EXPECT_NE(k, ParamKey("v", "w"));
  EXPECT_EQ(InitValue(Init::Normal(1), 1, k, 10), InitValue(Init::Normal(1), 1, k, 10));
  EXPECT_NE(InitValue(Init::Normal(1), 1, k, 10), InitValue(Init::Normal(1), 2, k, 10));
  EXPECT_EQ(InitValue(Init::Zeros(), 1, k, 3), 0.0f);
  EXPECT_EQ(InitValue(Init::Ones(), 1, k, 3), 1.0f);
  EXPECT_EQ(InitValue(Init::Constant(2.5f), 1, k, 3), 2.5f);
}

// Shapes come from callers: an element product that overflows (it once wrapped to a tiny unit) or a unit past
// 2^48 elements is refused naming the unit and the parameter.
TEST(UnitLayout, SizesThatOverflowAreErrors) {
  auto wraps =
      UnitLayout::Build("u", {ParamSpec{"w", {int64_t{1} << 32, int64_t{1} << 32, 2}, false, Init::Zeros()}}, 1);
  ASSERT_FALSE(wraps.ok());
  EXPECT_NE(wraps.status().message().find("unit 'u': parameter 'w' (shape [4294967296,4294967296,2]) exceeds 2^48"),
            absl::string_view::npos) << wraps.status();
  const int64_t half = int64_t{1} << 47;
  auto sum =
      UnitLayout::Build("u",
                        {ParamSpec{"a", {half}, false, Init::Zeros()}, ParamSpec{"b", {half}, false, Init::Zeros()},
                         ParamSpec{"c", {16}, false, Init::Zeros()}},
                        1);
  ASSERT_FALSE(sum.ok());
  EXPECT_NE(sum.status().message().find("the sum of its 3 parameters exceeds 2^48"), absl::string_view::npos)
      << sum.status();
  auto at_limit = UnitLayout::Build("u", {ParamSpec{"a", {int64_t{1} << 48}, false, Init::Zeros()}}, 4);
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_EQ(at_limit->total_elems, size_t{1} << 48);
  EXPECT_FALSE(UnitLayout::Build("u", {ParamSpec{"a", {1}, false, Init::Zeros()}}, (1 << 20) + 1).ok());
}

// Names go into checkpoint JSON (whose writer throws on invalid UTF-8) and messages: printable UTF-8 only.
TEST(UnitLayout, NamesMustBePrintableUtf8) {
  auto with = [](std::string unit, std::string param) {
    return UnitLayout::Build(unit, {ParamSpec{param, {2}, false, Init::Zeros()}}, 1);
  };
  EXPECT_TRUE(with("h.0", "attn.w").ok());
  EXPECT_TRUE(with("caf\xc3\xa9", "\xe2\x86\x92\xf0\x9f\x98\x80").ok()) << "two-, three- and four-byte forms";
  for (const std::string& bad :
       {std::string("\x8b"), std::string("a\xc3"), std::string("\xc0\xaf"),  // stray, cut, overlong
        std::string("\xed\xa0\x80"), std::string("\xf4\x90\x80\x80"),        // surrogate, > U+10FFFF
        std::string("a\nb"), std::string("\x7f"), std::string("\xc2\x85"),   // controls
        std::string(1025, 'x')}) {
    auto param = with("u", bad);
    ASSERT_FALSE(param.ok()) << bad;
    EXPECT_EQ(param.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(param.status().message().find("unit 'u': a parameter's name"), absl::string_view::npos) << param.status();
    EXPECT_FALSE(with(bad, "w").ok()) << bad;
  }
}

TEST(InitValue, NormalAndUniformHaveTheirMoments) {
  const uint64_t k = ParamKey("u", "w");
  const int n = 200000;
  double sum = 0, sq = 0, umax = 0;
  for (int i = 0; i < n; ++i) {
    const double x = InitValue(Init::Normal(0.5f), 3, k, i);
    sum += x;
    sq += x * x;
    umax = std::max(umax, std::fabs(double(InitValue(Init::Uniform(0.25f), 3, k, i))));
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sq / n), 0.5, 0.01);
  EXPECT_LE(umax, 0.25);
  EXPECT_GT(umax, 0.249);
}

}  // namespace
}  // namespace strata::shard
