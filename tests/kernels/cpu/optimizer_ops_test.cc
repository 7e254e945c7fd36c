// The segmented, multi-threaded optimizer passes: for every variant and thread count, each segment
// element equals the scalar element math (bit for bit), the per-segment step (weight decay) is honoured,
// the param copy is written, and elements outside segments are never touched.
#include "kernels/cpu/optimizer_ops.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/element_math.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace strata::kernels::cpu {
namespace {

using testing::AllIsas;
using testing::ExpectBitEqual;
using testing::IsaParamName;
using testing::Uniform;

class OptimizerOpsTest : public ::testing::TestWithParam<Isa> {};

// Segments with gaps between them, one empty, many tiny ones and one that spans many tiles.
std::vector<std::pair<size_t, size_t>> Ranges(size_t n) {
  std::vector<std::pair<size_t, size_t>> r = {{3, 10}, {10, 10}, {12, 13}};
  size_t pos = 20;
  for (int i = 0; i < 300 && pos + 5 < n; ++i, pos += 7) r.push_back({pos, pos + 5});  // tiny, gapped
  if (pos + 10 < n) r.push_back({pos + 10, n - 4});                                    // big, spans tiles
  return r;
}

struct Buffers {
  std::vector<float> master, grad, m, v;
  std::vector<uint16_t> copy;
};

Buffers Make(size_t n) {
  return Buffers{Uniform(n, -1, 1, 1), Uniform(n, -1, 1, 2), Uniform(n, -0.1f, 0.1f, 3), Uniform(n, 0, 0.01f, 4),
                 std::vector<uint16_t>(n, 0xbeef)};
}

TEST_P(OptimizerOpsTest, AdamWSegmentsEqualTheElementMathForEveryThreadCount) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  const size_t n = 3 * kOptimizerTileElems + 1234;
  const AdamWStep decay = MakeAdamWStep(1e-3, 0.9, 0.999, 1e-8, 0.1, 7);
  const AdamWStep no_decay = MakeAdamWStep(1e-3, 0.9, 0.999, 1e-8, 0.0, 7);
  std::vector<AdamWSegment> segs;
  for (auto [b, e] : Ranges(n)) segs.push_back({b, e, segs.size() % 2 ? &no_decay : &decay});
  // Reference: the element function, element by element, only inside segments.
  Buffers want = Make(n);
  for (const AdamWSegment& s : segs) {
    for (size_t i = s.begin; i < s.end; ++i) {
      AdamWElement(want.grad[i] * 0.5f, want.master[i], want.m[i], want.v[i], *s.step);
      want.copy[i] = FloatToBf16(want.master[i]);
    }
  }
  for (int threads : {0, 1, 2, 3}) {  // 0: no pool
    ThreadPool pool(ThreadPool::Options{threads < 1 ? 1 : threads, {}});
    Buffers got = Make(n);
    const OptimizerArrays a{got.master.data(), got.grad.data(), got.m.data(), got.v.data(), got.copy.data(),
                            ParamCopy::kBf16};
    AdamWSegments(*k, threads == 0 ? nullptr : &pool, a, segs.data(), segs.size(), 0.5f);
    const std::string what = "threads=" + std::to_string(threads);
    ExpectBitEqual(want.master, got.master, what + " master");
    ExpectBitEqual(want.m, got.m, what + " m");
    ExpectBitEqual(want.v, got.v, what + " v");
    ExpectBitEqual(want.copy, got.copy, what + " bf16 copy (0xbeef outside segments)");
  }
}

TEST_P(OptimizerOpsTest, SgdSegmentsEqualTheElementMathForEveryThreadCount) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  const size_t n = 2 * kOptimizerTileElems + 77;
  const SgdStep decay{0.1f, 0.9f, 0.01f}, no_decay{0.1f, 0.9f, 0.0f};
  std::vector<SgdSegment> segs;
  for (auto [b, e] : Ranges(n)) segs.push_back({b, e, segs.size() % 3 ? &decay : &no_decay});
  Buffers want = Make(n);
  for (const SgdSegment& s : segs) {
    for (size_t i = s.begin; i < s.end; ++i) {
      SgdElement(want.grad[i] * 2.0f, want.master[i], want.m[i], *s.step);
      want.copy[i] = FloatToHalf(want.master[i]);
    }
  }
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(ThreadPool::Options{threads, {}});
    Buffers got = Make(n);
    const OptimizerArrays a{got.master.data(), got.grad.data(), got.m.data(), nullptr, got.copy.data(),
                            ParamCopy::kF16};
    SgdSegments(*k, &pool, a, segs.data(), segs.size(), 2.0f);
    const std::string what = "threads=" + std::to_string(threads);
    ExpectBitEqual(want.master, got.master, what + " master");
    ExpectBitEqual(want.m, got.m, what + " momentum");
    ExpectBitEqual(want.copy, got.copy, what + " fp16 copy");
    ExpectBitEqual(Make(n).v, got.v, what + " v (SGD must not touch it)");
  }
}

TEST_P(OptimizerOpsTest, NoSegmentsTouchesNothing) {
  STRATA_KERNELS_OR_SKIP(k, GetParam());
  ThreadPool pool(ThreadPool::Options{2, {}});
  Buffers got = Make(10);
  const OptimizerArrays a{got.master.data(), got.grad.data(), got.m.data(), got.v.data(), nullptr, ParamCopy::kNone};
  AdamWSegments(*k, &pool, a, nullptr, 0, 1.0f);
  ExpectBitEqual(Make(10).master, got.master, "master");
}

INSTANTIATE_TEST_SUITE_P(AllVariants, OptimizerOpsTest, ::testing::ValuesIn(AllIsas()), IsaParamName);

}  // namespace
}  // namespace strata::kernels::cpu
