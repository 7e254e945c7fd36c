// The GPT on a GPU against the host implementation on the same weights (label gpu; skips where no GPU
// is visible): a CUDA engine with the CUDA back-end and a host engine with the host kernels start from
// the same deterministic initialisation and see the same tokens; the loss, the logits and the weights
// after a few ZeRO-3 steps agree within fp32 rounding of differently ordered sums (cuBLASLt without
// TF32, the device reductions), and a bf16-parameter run agrees within bf16 rounding. With bf16 products
// and cuDNN's fused attention the same holds within bf16 rounding of every factor.
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "models/gpt/model/gpt_model.h"
#include "runtime/base/status.h"
#include "runtime/comm/in_process.h"
#include "runtime/device/cuda_device.h"
#include "runtime/device/host_device.h"
#include "tests/runtime/device/cuda_device_fixture.h"

namespace strata::gpt {
namespace {

struct Run {
  std::vector<double> losses;
  std::vector<float> logits;  // of position 3 of sequence 0, after training
  std::vector<float> weights;
};

absl::StatusOr<Run> Train(device::Device& dev, bool cuda, const GptConfig& c, DType dtype, int steps, int B,
                          const NnOptions& options = {}, std::string* attention = nullptr) {
  auto comms = comm::CreateInProcessGroup(1, comm::Options{});
  engine::EngineConfig ec;
  ec.stage = 3;
  ec.param_dtype = dtype;
  ec.optimizer.lr = 1e-3;
  STRATA_ASSIGN_OR_RETURN(auto e, engine::Engine::Create(ec, *comms[0], dev));
  std::unique_ptr<NnBackend> nn;
  if (cuda) {
    STRATA_ASSIGN_OR_RETURN(nn, MakeCudaNn(options));
  }
  STRATA_ASSIGN_OR_RETURN(GptModel m, GptModel::Register(*e, c, std::move(nn)));
  STRATA_RETURN_IF_ERROR(e->Finalize());
  std::mt19937 rng(5);
  Run r;
  std::vector<int32_t> in(size_t(B) * c.seq_len), tg(in.size());
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = static_cast<int32_t>(rng() % c.vocab);
      tg[i] = static_cast<int32_t>(rng() % c.vocab);
    }
    STRATA_RETURN_IF_ERROR(e->BeginMicroBatch());
    STRATA_ASSIGN_OR_RETURN(double loss, m.TrainMicroBatch(*e, in.data(), tg.data(), B, 1.0f, false));
    STRATA_RETURN_IF_ERROR(e->EndMicroBatch());
    STRATA_RETURN_IF_ERROR(e->Step().status());
    r.losses.push_back(loss);
  }
  STRATA_RETURN_IF_ERROR(m.Forward(*e, in.data(), nullptr, 1, c.seq_len, &r.logits, 3).status());
  if (attention != nullptr) *attention = m.nn().attention_in_use();
  STRATA_ASSIGN_OR_RETURN(r.weights, e->GatherAllParams());
  return r;
}

// max |a - b| / max(1, max |b|)
double MaxScaledDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

class GptOnCuda : public device::testing::CudaDeviceFixture {
 protected:
  device::HostDevice host_;
};

TEST_F(GptOnCuda, ForwardBackwardAndStepsMatchTheHost) {
  const GptConfig c{2, 64, 4, 32, 97};  // layers, d_model, heads, seq_len, vocab (odd vocab on purpose)
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    auto want = Train(host_, false, c, dtype, 5, 3);
    auto got = Train(*cuda_, true, c, dtype, 5, 3);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    // fp32: sums in another order, ~1e-6 relative per op; bf16 params: a rounding flip of one parameter
    // (2^-8 relative) propagates, so the bound is wider.
    const double tol = dtype == DType::kF32 ? 2e-5 : 2e-2;
    for (size_t s = 0; s < want->losses.size(); ++s) {
      EXPECT_NEAR(got->losses[s], want->losses[s], tol * std::fabs(want->losses[s]))
          << DTypeName(dtype) << " step " << s;
    }
    EXPECT_LT(MaxScaledDiff(got->logits, want->logits), tol) << DTypeName(dtype) << " logits";
    EXPECT_LT(MaxScaledDiff(got->weights, want->weights), tol) << DTypeName(dtype) << " weights";
  }
}

// bf16 products (factors rounded to bf16, fp32 accumulation) and the fused attention (bf16 q, k, v, P):
// each rounding is 2^-9 relative, so the run agrees with the fp32 host within bf16 tolerance, and the
// fused attention is what ran (head dim 16 is one cuDNN takes on SM80+).
TEST_F(GptOnCuda, Bf16ProductsAndFusedAttentionMatchTheHostWithinBf16Rounding) {
  const GptConfig c{2, 64, 4, 32, 97};
  auto want = Train(host_, false, c, DType::kF32, 5, 3);
  ASSERT_TRUE(want.ok()) << want.status();
  struct Case {
    Products products;
    AttentionKind attention;
    const char* expect;
  };
  for (const Case& k : {Case{Products::kBf16, AttentionKind::kReference, "reference"},
                        Case{Products::kF32, AttentionKind::kFused, "fused"},
                        Case{Products::kBf16, AttentionKind::kAuto, "fused"}}) {
    std::string used;
    auto got = Train(*cuda_, true, c, DType::kF32, 5, 3, NnOptions{k.products, k.attention}, &used);
    const std::string what = std::string(ProductsName(k.products)) + " products, " + k.expect + " attention";
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    EXPECT_EQ(used, k.expect) << what;
    for (size_t s = 0; s < want->losses.size(); ++s) {
      EXPECT_NEAR(got->losses[s], want->losses[s], 2e-2 * std::fabs(want->losses[s])) << what << " step " << s;
    }
    EXPECT_LT(MaxScaledDiff(got->logits, want->logits), 3e-2) << what << " logits";
    EXPECT_LT(MaxScaledDiff(got->weights, want->weights), 2e-2) << what << " weights";
  }
}

}  // namespace
}  // namespace strata::gpt
