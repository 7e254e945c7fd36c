// Each CUDA NN kernel (kernels/cuda: layernorm, gelu, add, cross_entropy, embedding, attention) against
// its host twin in models/gpt/nn/cpu/nn.h (itself checked against double references in
// tests/models/gpt/nn/cpu/nn_test.cc) on random inputs of awkward shapes: odd channel counts (C = 65), short and
// block-straddling sequences (T = 1, 7, 131), vocabularies of 5 (repeated tokens), 1003 and GPT-2's 50257, and empty
// inputs.
//
// Tolerances, by what the two sides share (models/gpt/nn/common/nn_math.h):
// - Bit for bit (NaN matching any NaN: the GPU's NaN is canonical): GELU, adds, embeddings and the
//   cross-entropy backward. Each element is the same sequence of IEEE operations on both sides
//   (--fmad=false, no contraction on the host), in the same order for the accumulated embedding grads
//   (Note [Deterministic embedding backward]).
// - Within a few ulp, elementwise: cross-entropy probs and losses. The row max is exact and every exp is
//   the host's bits; only the double sum's order differs, which moves float(1 / sum) and the loss by at
//   most an ulp, so 4 ulp (5e-7 relative) bounds an element.
// - Within 1e-5 of the output's scale (largest |host value|): LayerNorm and attention, whose row sums and
//   dot products run in another order (warp trees, sequential loops instead of sgemm). Each side is
//   within ~3e-7 of scale of the exact result on these sizes (nn_test.cc, kRowRtol), so 1e-5 leaves
//   more than 10x; the large-score attention case uses nn_test's 1e-4.
// Accumulated outputs start from the same random prefill on both sides; written outputs start as NaN.
// Needs a GPU: skips with the reason when none is visible. Label gpu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/add.cuh"
#include "models/gpt/nn/cpu/nn.h"
#include "models/gpt/nn/cuda/attention.cuh"
#include "models/gpt/nn/cuda/cross_entropy.cuh"
#include "models/gpt/nn/cuda/embedding.cuh"
#include "models/gpt/nn/cuda/gelu.cuh"
#include "models/gpt/nn/cuda/layernorm.cuh"
#include "tests/kernels/cpu/kernel_test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace strata::kernels::cuda {
namespace {

using cpu::testing::Bits;
using cpu::testing::Uniform;
using testing::DeviceVec;
using Vec = std::vector<float>;

constexpr float kGarbage = std::numeric_limits<float>::quiet_NaN();
constexpr double kScaleRtol = 1e-5;   // reordered sums (header comment)
constexpr double kUlpRtol = 5e-7;     // 4 ulp of fp32, elementwise

class NnCudaTest : public testing::CudaDeviceTest {};

// Every element of `got` (device) against `want` (host): both NaN, or |got - want| <= tol(want), where
// a tolerance of 0 means the same bits. Reports the first mismatches with index, expected and actual.
template <class Tol>
void ExpectWithin(const Vec& want, const Vec& got, const std::string& what, Tol tol) {
  ASSERT_EQ(want.size(), got.size()) << what;
  std::ostringstream msg;
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double t = tol(want[i]);
    const bool ok = (std::isnan(want[i]) && std::isnan(got[i])) ||
                    (t == 0 ? Bits(want[i]) == Bits(got[i]) : std::fabs(static_cast<double>(got[i]) - want[i]) <= t);
    if (ok) continue;
    if (bad < 8) {
      msg << "\n  " << what << "[" << i << "]: expected " << want[i] << " (0x" << std::hex << Bits(want[i])
          << "), actual " << std::dec << got[i] << " (0x" << std::hex << Bits(got[i]) << std::dec << "), tol " << t;
    }
    ++bad;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " elements off" << msg.str();
}

void ExpectSame(const Vec& want, const Vec& got, const std::string& what) {
  ExpectWithin(want, got, what, [](float) { return 0.0; });
}

// Within rtol of the larger of min_scale and the largest finite |want|.
void ExpectScaleClose(const Vec& want, const Vec& got, const std::string& what, double rtol = kScaleRtol,
                      double min_scale = 1e-30) {
  double scale = min_scale;
  for (float w : want) {
    if (std::isfinite(w)) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  }
  ExpectWithin(want, got, what, [&](float) { return rtol * scale; });
}

void ExpectUlpClose(const Vec& want, const Vec& got, const std::string& what, double abs_floor) {
  ExpectWithin(want, got, what, [&](float w) { return kUlpRtol * std::fabs(w) + abs_floor; });
}

// Every DeviceVec of a test allocated and filled.
// ============================== LayerNorm ==============================

struct RowShape {
  int B, T, C;
};
// C = 65 (odd, two partial warps), C = 1, C = 768 (GPT-2); N = 99 and 256 rows span several
// kLayerNormRowsPerBlock chunks, the first with a partial last one.
const RowShape kRowShapes[] = {{2, 7, 65}, {1, 1, 1}, {3, 33, 768}, {4, 64, 65}};

TEST_F(NnCudaTest, LayerNormMatchesHostAndParamGradsAreDeterministic) {
  uint32_t seed = 100;
  for (const RowShape& s : kRowShapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C);
    const int N = s.B * s.T, C = s.C;
    const size_t n = static_cast<size_t>(N) * C;
    const Vec x = Uniform(n, -2, 2, ++seed), w = Uniform(C, -1, 1, ++seed), b = Uniform(C, -1, 1, ++seed);
    const Vec dout = Uniform(n, -1, 1, ++seed);
    const Vec dx0 = Uniform(n, -1, 1, ++seed), dw0 = Uniform(C, -1, 1, ++seed), db0 = Uniform(C, -1, 1, ++seed);
    Vec out(n, kGarbage), mean(N, kGarbage), rstd(N, kGarbage), dx = dx0, dw = dw0, db = db0;
    cpu::LayerNormForward(x.data(), w.data(), b.data(), out.data(), mean.data(), rstd.data(), N, C);
    cpu::LayerNormBackward(dout.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(),
                           db.data(), N, C);

    DeviceVec<float> d_x(x), d_w(w), d_b(b), d_dout(dout), d_out(Vec(n, kGarbage)), d_mean(Vec(N, kGarbage)),
        d_rstd(Vec(N, kGarbage)), d_dx(dx0), d_dw(dw0), d_db(db0), d_dw2(dw0), d_db2(db0), d_dx2(dx0),
        d_work(Vec(LayerNormBackwardWorkspaceBytes(N, C) / sizeof(float), kGarbage));
    ASSERT_ALL_OK(d_x.ok(), d_w.ok(), d_b.ok(), d_dout.ok(), d_out.ok(), d_mean.ok(), d_rstd.ok(), d_dx.ok(),
                  d_dw.ok(), d_db.ok(), d_dw2.ok(), d_db2.ok(), d_dx2.ok(), d_work.ok());
    ASSERT_CUDA(LaunchLayerNormForward(d_x.get(), d_w.get(), d_b.get(), d_out.get(), d_mean.get(), d_rstd.get(), N,
                                       C, 1e-5f, nullptr));
    // The backward from the device's own mean and rstd, twice (from the same prefill) for determinism.
    ASSERT_CUDA(LaunchLayerNormBackward(d_dout.get(), d_x.get(), d_w.get(), d_mean.get(), d_rstd.get(), d_dx.get(),
                                        d_dw.get(), d_db.get(), N, C, d_work.get(), nullptr));
    ASSERT_CUDA(LaunchLayerNormBackward(d_dout.get(), d_x.get(), d_w.get(), d_mean.get(), d_rstd.get(),
                                        d_dx2.get(), d_dw2.get(), d_db2.get(), N, C, d_work.get(), nullptr));
    ASSERT_CUDA(cudaDeviceSynchronize());
    ExpectScaleClose(out, d_out.Host(), "out");
    ExpectScaleClose(mean, d_mean.Host(), "mean", kScaleRtol, /*min_scale=*/1.0);  // |x| <= 2: judged on 1
    ExpectScaleClose(rstd, d_rstd.Host(), "rstd");
    ExpectScaleClose(dx, d_dx.Host(), "dx");
    ExpectScaleClose(dw, d_dw.Host(), "dw");
    ExpectScaleClose(db, d_db.Host(), "db");
    ExpectSame(d_dx.Host(), d_dx2.Host(), "dx, second run");
    ExpectSame(d_dw.Host(), d_dw2.Host(), "dw, second run");
    ExpectSame(d_db.Host(), d_db2.Host(), "db, second run");
  }
}

TEST_F(NnCudaTest, EmptyInputsLaunchNothingAndSucceed) {
  EXPECT_EQ(LayerNormBackwardWorkspaceBytes(0, 768), 0u);
  ASSERT_CUDA(LaunchLayerNormForward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 65, 1e-5f, nullptr));
  ASSERT_CUDA(LaunchLayerNormBackward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 65,
                                      nullptr, nullptr));
  ASSERT_CUDA(LaunchGeluForward(nullptr, nullptr, 0, nullptr));
  ASSERT_CUDA(LaunchGeluBackward(nullptr, nullptr, nullptr, 0, nullptr));
  ASSERT_CUDA(LaunchAdd(nullptr, nullptr, nullptr, 0, nullptr));
  ASSERT_CUDA(LaunchAddInto(nullptr, nullptr, 0, nullptr));
  ASSERT_CUDA(LaunchCrossEntropyBackward(nullptr, nullptr, nullptr, 1.0f, 0, 1003, nullptr));
  ASSERT_CUDA(LaunchEmbeddingForward(nullptr, nullptr, nullptr, nullptr, 0, 7, 65, nullptr));
  ASSERT_CUDA(LaunchEmbeddingBackward(nullptr, nullptr, nullptr, nullptr, 0, 7, 65, nullptr));
  ASSERT_CUDA(LaunchAttentionForward(nullptr, nullptr, nullptr, 0, 7, 65, 5, nullptr));
  ASSERT_CUDA(LaunchAttentionBackward(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 7, 65, 5, nullptr));
  // The mean of no rows is NaN, as the host's CrossEntropyForward returns.
  DeviceVec<double> mean(std::vector<double>{0.0});
  ASSERT_TRUE(mean.ok());
  ASSERT_CUDA(LaunchCrossEntropyForward(nullptr, nullptr, nullptr, nullptr, 0, 1003, mean.get(), nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(std::isnan(mean.Host()[0]));
}

// ============================== GELU, adds ==============================

// Sizes 1, 7 (scalar only), 4099 and ~1M (vector body), at an aligned start and one element off (the
// scalar head, then 16-byte vectors), and with the output misaligned from the input (element by element).
const size_t kElemSizes[] = {1, 7, 4099, 1000003};

Vec GeluInputs(size_t n, uint32_t seed) {
  Vec x = Uniform(n, -12, 12, seed);
  // Zeros, tiny, both tails, either side of the exponent cap (~-9.7) and the gradient clamp (+-10),
  // the fp32 extremes, Inf and NaN.
  const float specials[] = {0.0f, -0.0f, 1e-20f, -9.3f, -9.8f, -10.5f, 10.5f, 20.0f, -20.0f, 1e30f, -1e30f,
                            3e38f, -3e38f, INFINITY, -INFINITY, kGarbage};
  for (size_t i = 0; i < n && i < std::size(specials); ++i) x[i] = specials[i];
  return x;
}

TEST_F(NnCudaTest, GeluMatchesHostBitForBit) {
  for (size_t n : kElemSizes) {
    for (size_t pad_in : {0, 1}) {
      for (size_t pad_out : {0, 2}) {
        const std::string what = "n=" + std::to_string(n) + " pads=" + std::to_string(pad_in) + "," +
                                 std::to_string(pad_out);
        const Vec x = GeluInputs(n, 200), dout = Uniform(n, -1, 1, 201);
        Vec out(n, kGarbage), dx(n, kGarbage);
        cpu::GeluForward(x.data(), out.data(), n);
        cpu::GeluBackward(x.data(), dout.data(), dx.data(), n);
        DeviceVec<float> d_x(x, pad_in), d_dout(dout, pad_in), d_out(Vec(n, kGarbage), pad_out),
            d_dx(Vec(n, kGarbage), pad_out);
        ASSERT_ALL_OK(d_x.ok(), d_dout.ok(), d_out.ok(), d_dx.ok());
        ASSERT_CUDA(LaunchGeluForward(d_x.get(), d_out.get(), n, nullptr));
        ASSERT_CUDA(LaunchGeluBackward(d_x.get(), d_dout.get(), d_dx.get(), n, nullptr));
        ASSERT_CUDA(cudaDeviceSynchronize());
        ExpectSame(out, d_out.Host(), "gelu " + what);
        ExpectSame(dx, d_dx.Host(), "gelu' " + what);
      }
    }
  }
}

TEST_F(NnCudaTest, AddAndAddIntoMatchHostBitForBitIncludingInPlace) {
  for (size_t n : kElemSizes) {
    for (size_t pad : {0, 1}) {
      const std::string what = "n=" + std::to_string(n) + " pad=" + std::to_string(pad);
      const Vec a = Uniform(n, -1, 1, 300), b = Uniform(n, -1e3f, 1e3f, 301);
      Vec sum(n, kGarbage), into = a;
      cpu::Add(a.data(), b.data(), sum.data(), n);
      cpu::AddInto(into.data(), b.data(), n);
      DeviceVec<float> d_a(a, pad), d_b(b, 0), d_out(Vec(n, kGarbage), pad), d_into(a, 0);
      ASSERT_ALL_OK(d_a.ok(), d_b.ok(), d_out.ok(), d_into.ok());
      ASSERT_CUDA(LaunchAdd(d_a.get(), d_b.get(), d_out.get(), n, nullptr));
      ASSERT_CUDA(LaunchAddInto(d_into.get(), d_b.get(), n, nullptr));
      ASSERT_CUDA(LaunchAdd(d_a.get(), d_b.get(), d_a.get(), n, nullptr));  // out == a: a residual update
      ASSERT_CUDA(cudaDeviceSynchronize());
      ExpectSame(sum, d_out.Host(), "add " + what);
      ExpectSame(into, d_into.Host(), "add-into " + what);
      ExpectSame(sum, d_a.Host(), "in-place add " + what);
    }
  }
}

// ============================== cross-entropy ==============================

struct CeShape {
  int N, V;
  bool invalid_targets;  // rows 1 and 2 get targets V and -1: NaN loss, gradient and mean
};
const CeShape kCeShapes[] = {{14, 1003, false}, {1, 37, false}, {3, 50257, false}, {5, 7, true}, {4, 1003, true}};

std::vector<int32_t> RandomTokens(size_t n, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = dist(rng);
  return t;
}

TEST_F(NnCudaTest, CrossEntropyMatchesHostIncludingInvalidTargetsAndInPlace) {
  uint32_t seed = 400;
  for (const CeShape& s : kCeShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " V=" << s.V);
    const size_t n = static_cast<size_t>(s.N) * s.V;
    const Vec logits = Uniform(n, -8, 8, ++seed);
    std::vector<int32_t> targets = RandomTokens(s.N, s.V, ++seed);
    if (s.invalid_targets) targets[1] = s.V, targets[2] = -1;
    const float dloss = 1.0f / s.N;
    Vec probs(n, kGarbage), losses(s.N, kGarbage), dlogits(n, kGarbage);
    const double mean = cpu::CrossEntropyForward(logits.data(), targets.data(), probs.data(), losses.data(), s.N, s.V);
    cpu::CrossEntropyBackward(probs.data(), targets.data(), dlogits.data(), dloss, s.N, s.V);

    DeviceVec<float> d_logits(logits), d_probs(Vec(n, kGarbage)), d_losses(Vec(s.N, kGarbage)), d_inplace(logits),
        d_losses2(Vec(s.N, kGarbage)), d_host_probs(probs), d_dlogits(Vec(n, kGarbage));
    DeviceVec<int32_t> d_targets(targets);
    DeviceVec<double> d_mean(std::vector<double>{0.0});
    ASSERT_ALL_OK(d_logits.ok(), d_probs.ok(), d_losses.ok(), d_inplace.ok(), d_losses2.ok(), d_host_probs.ok(),
                  d_dlogits.ok(), d_targets.ok(), d_mean.ok());
    ASSERT_CUDA(LaunchCrossEntropyForward(d_logits.get(), d_targets.get(), d_probs.get(), d_losses.get(), s.N, s.V,
                                          d_mean.get(), nullptr));
    ASSERT_CUDA(LaunchCrossEntropyForward(d_inplace.get(), d_targets.get(), d_inplace.get(), d_losses2.get(), s.N,
                                          s.V, nullptr, nullptr));
    // The backward from the host's probs, so that it is judged alone; then in place over them.
    ASSERT_CUDA(LaunchCrossEntropyBackward(d_host_probs.get(), d_targets.get(), d_dlogits.get(), dloss, s.N, s.V,
                                           nullptr));
    ASSERT_CUDA(LaunchCrossEntropyBackward(d_host_probs.get(), d_targets.get(), d_host_probs.get(), dloss, s.N, s.V,
                                           nullptr));
    ASSERT_CUDA(cudaDeviceSynchronize());
    // Probabilities reach below 1e-7 at V = 50257 (judged relative to themselves, floor at the subnormals);
    // losses are >= 0 and may be near 0 for a confident row (floor 1e-12: the double sum's rounding).
    ExpectUlpClose(probs, d_probs.Host(), "probs", 1e-40);
    ExpectUlpClose(losses, d_losses.Host(), "losses", 1e-12);
    ExpectSame(d_probs.Host(), d_inplace.Host(), "probs in place vs separate");
    ExpectSame(d_losses.Host(), d_losses2.Host(), "losses in place vs separate");
    const double d_mean_value = d_mean.Host()[0];
    if (std::isnan(mean)) {
      EXPECT_TRUE(std::isnan(d_mean_value)) << "mean";
    } else {
      EXPECT_NEAR(d_mean_value, mean, 1e-12 * std::max(1.0, std::fabs(mean))) << "mean";
    }
    ExpectSame(dlogits, d_dlogits.Host(), "dlogits");
    ExpectSame(dlogits, d_host_probs.Host(), "dlogits in place");
  }
}

// ============================== embeddings ==============================

struct EmbShape {
  int B, T, C, V;
};
// V = 5: every token repeats many times, within and across sequences; C = 768 spans three channel blocks.
const EmbShape kEmbShapes[] = {{4, 7, 65, 1003}, {2, 131, 768, 5}, {3, 1, 1, 2}, {1, 300, 65, 50257}};

TEST_F(NnCudaTest, EmbeddingMatchesHostBitForBitWithRepeatedTokens) {
  uint32_t seed = 500;
  for (const EmbShape& s : kEmbShapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " V=" << s.V);
    const size_t N = static_cast<size_t>(s.B) * s.T, vc = static_cast<size_t>(s.V) * s.C;
    const size_t tc = static_cast<size_t>(s.T) * s.C;
    const std::vector<int32_t> tokens = RandomTokens(N, s.V, ++seed);
    const Vec wte = Uniform(vc, -1, 1, ++seed), wpe = Uniform(tc, -1, 1, ++seed);
    const Vec dout = Uniform(N * s.C, -1, 1, ++seed);
    const Vec dwte0 = Uniform(vc, -1, 1, ++seed), dwpe0 = Uniform(tc, -1, 1, ++seed);
    Vec out(N * s.C, kGarbage), dwte = dwte0, dwpe = dwpe0;
    cpu::EmbeddingForward(tokens.data(), wte.data(), wpe.data(), out.data(), s.B, s.T, s.C);
    cpu::EmbeddingBackward(dout.data(), tokens.data(), dwte.data(), dwpe.data(), s.B, s.T, s.C);

    DeviceVec<int32_t> d_tokens(tokens);
    DeviceVec<float> d_wte(wte), d_wpe(wpe), d_dout(dout), d_out(Vec(N * s.C, kGarbage)), d_dwte(dwte0),
        d_dwpe(dwpe0);
    ASSERT_ALL_OK(d_tokens.ok(), d_wte.ok(), d_wpe.ok(), d_dout.ok(), d_out.ok(), d_dwte.ok(), d_dwpe.ok());
    ASSERT_CUDA(LaunchEmbeddingForward(d_tokens.get(), d_wte.get(), d_wpe.get(), d_out.get(), s.B, s.T, s.C, nullptr));
    ASSERT_CUDA(LaunchEmbeddingBackward(d_dout.get(), d_tokens.get(), d_dwte.get(), d_dwpe.get(), s.B, s.T, s.C,
                                        nullptr));
    ASSERT_CUDA(cudaDeviceSynchronize());
    ExpectSame(out, d_out.Host(), "out");
    ExpectSame(dwte, d_dwte.Host(), "dwte");
    ExpectSame(dwpe, d_dwpe.Host(), "dwpe");
  }
}

// ============================== attention ==============================

struct AttnShape {
  int B, T, C, NH;
};
// Head size 13 (C = 65, odd), a single token, T = 131 (rows longer than a warp, across the host's 64-row
// blocks), GPT-2's head size 64.
const AttnShape kAttnShapes[] = {{2, 7, 65, 5}, {1, 1, 8, 2}, {1, 131, 32, 2}, {2, 64, 128, 2}};

void CompareAttention(const AttnShape& s, float lo, float hi, double rtol, uint32_t seed) {
  const size_t n_qkv = static_cast<size_t>(s.B) * s.T * 3 * s.C, n_out = static_cast<size_t>(s.B) * s.T * s.C;
  const size_t n_att = static_cast<size_t>(s.B) * s.NH * s.T * s.T;
  const Vec qkv = Uniform(n_qkv, lo, hi, seed), dout = Uniform(n_out, -1, 1, seed + 1);
  Vec out(n_out, kGarbage), att(n_att, kGarbage), dqkv(n_qkv, kGarbage), datt(n_att, kGarbage);
  cpu::AttentionForward(qkv.data(), out.data(), att.data(), s.B, s.T, s.C, s.NH);
  cpu::AttentionBackward(dout.data(), qkv.data(), att.data(), dqkv.data(), datt.data(), s.B, s.T, s.C, s.NH);

  DeviceVec<float> d_qkv(qkv), d_dout(dout), d_out(Vec(n_out, kGarbage)), d_att(Vec(n_att, kGarbage)),
      d_dqkv(Vec(n_qkv, kGarbage)), d_datt(Vec(n_att, kGarbage));
  ASSERT_ALL_OK(d_qkv.ok(), d_dout.ok(), d_out.ok(), d_att.ok(), d_dqkv.ok(), d_datt.ok());
  ASSERT_CUDA(LaunchAttentionForward(d_qkv.get(), d_out.get(), d_att.get(), s.B, s.T, s.C, s.NH, nullptr));
  ASSERT_CUDA(LaunchAttentionBackward(d_dout.get(), d_qkv.get(), d_att.get(), d_dqkv.get(), d_datt.get(), s.B, s.T,
                                      s.C, s.NH, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  const Vec g_att = d_att.Host(), g_datt = d_datt.Host();
  ExpectScaleClose(att, g_att, "att", rtol, /*min_scale=*/1.0);  // probabilities: judged against 1
  ExpectScaleClose(out, d_out.Host(), "out", rtol);
  ExpectScaleClose(dqkv, d_dqkv.Host(), "dqkv", rtol);
  ExpectScaleClose(datt, g_datt, "datt", rtol);
  // The causal mask is exact: every entry above the diagonal is 0 in att and in the datt scratch.
  for (size_t r = 0; r < n_att / s.T; ++r) {
    const int t = static_cast<int>(r % s.T);
    for (int t2 = t + 1; t2 < s.T; ++t2) {
      ASSERT_EQ(g_att[r * s.T + t2], 0.0f) << "att row " << r << " t2 " << t2;
      ASSERT_EQ(g_datt[r * s.T + t2], 0.0f) << "datt row " << r << " t2 " << t2;
    }
  }
}

TEST_F(NnCudaTest, AttentionMatchesHostAndMaskIsExact) {
  uint32_t seed = 600;
  for (const AttnShape& s : kAttnShapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    CompareAttention(s, -2, 2, kScaleRtol, seed += 2);
  }
}

TEST_F(NnCudaTest, AttentionWithLargeScoresStaysFiniteAndMatchesHost) {
  // Scores up to ~290 (q, k in [-12, 12], head size 4): exp overflows without the row max. The scores'
  // own fp32 rounding (~2e-5 absolute) becomes relative error of the probabilities on both sides, as in
  // nn_test.cc's large-score case: 1e-4 of scale.
  CompareAttention(AttnShape{2, 9, 8, 2}, -12, 12, 1e-4, 700);
}

}  // namespace
}  // namespace strata::kernels::cuda
