#include "models/gpt/spec/gpt_spec.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "models/gpt/model/gpt_model.h"
#include "models/gpt/model/nn_backend.h"

namespace strata::gpt {
namespace {

class GptSpec final : public spec::ModelSpec {
 public:
  explicit GptSpec(const GptConfig& cfg) : c_(cfg) {}
  const GptConfig& config() const { return c_; }

  absl::Status Validate() const override { return gpt::Validate(c_); }
  std::string Describe() const override { return gpt::Describe(c_); }
  // "12 layers x d_model 64": `bench capacity`'s candidates, which differ in one of the two.
  std::string Shape() const override { return absl::StrCat(c_.layers, " layers x d_model ", c_.d_model); }
  std::vector<spec::Dimension> Dimensions() const override {
    return {{"layers", c_.layers}, {"d_model", c_.d_model}, {"heads", c_.heads}, {"seq_len", c_.seq_len},
            {"vocab", c_.vocab}};
  }
  int64_t NumParams() const override { return gpt::NumParams(c_); }
  int SequenceLength() const override { return c_.seq_len; }

  std::vector<spec::UnitSpec> Units() const override {
    std::vector<spec::UnitSpec> out;
    for (UnitSpec& u : UnitSpecs(c_)) out.push_back({std::move(u.name), std::move(u.params)});
    return out;
  }
  uint64_t ActivationBytes(int micro_batch, bool checkpointing, const spec::ComputeTarget& t) const override {
    // On a GPU, bf16 parameters compute in bf16 products, where the trainer picks cuDNN's fused attention
    // (--attention auto); fp32 runs the reference kernel, as the host always does.
    const AttentionBuffers att = t.gpu && t.param_dtype == DType::kBF16
                                     ? FusedAttentionBuffers(micro_batch, c_.seq_len, c_.d_model, c_.heads)
                                     : ReferenceAttentionBuffers(micro_batch, c_.seq_len, c_.heads);
    return WorkspaceBytes(c_, micro_batch, c_.seq_len, checkpointing, att);
  }
  uint64_t UnitCopyBytes(DType param_dtype, size_t largest_unit_elems) const override {
    return uint64_t(UnitCopyFloats(param_dtype, largest_unit_elems)) * sizeof(float);
  }

  double ForwardFlopsPerToken() const override { return gpt::ForwardFlopsPerToken(c_); }
  spec::StepUses Uses(int micro_batch) const override;
  spec::Product HostProduct(int micro_batch) const override {  // the MLP's first product: [B*T, C] x [C, 4C]
    return {micro_batch * c_.seq_len, c_.d_model, 4 * c_.d_model};
  }
  double HostProductGflops(const spec::Product& p, double seconds) const override {
    return SgemmGflops(p.m, p.k, p.n, seconds);
  }

  spec::Growth Grows(bool width) const override {
    // Width keeps the head count and grows in multiples of it; dimensions stop at 2^30.
    if (width) return {"d_model", std::max(1, c_.d_model / c_.heads), (int64_t{1} << 30) / std::max(1, c_.heads)};
    return {"layers", std::max(1, c_.layers), int64_t{1} << 30};
  }
  std::shared_ptr<const spec::ModelSpec> Scaled(bool width, int64_t k) const override {
    GptConfig m = c_;
    if (width) {
      m.d_model = static_cast<int>(k * m.heads);  // keep the head count; width in multiples of it
    } else {
      m.layers = static_cast<int>(k);
    }
    return Spec(m);
  }

 private:
  GptConfig c_;
};

// The trainer's order (GptModel::TrainMicroBatch): the embeddings, the blocks, the final LayerNorm, the
// head (the tied embeddings); backward the reverse, the lookup's backward last, where the embeddings' gradient
// is complete. The FLOPs: the head is what a model without blocks computes, each block the rest over L.
spec::StepUses GptSpec::Uses(int micro_batch) const {
  const int L = c_.layers, embed = 0, ln_f = L + 1;
  const double tokens = double(micro_batch) * c_.seq_len;
  GptConfig headless = c_;
  headless.layers = 0;
  const double head_flops = gpt::ForwardFlopsPerToken(headless) * tokens;
  const double block_flops = (gpt::ForwardFlopsPerToken(c_) * tokens - head_flops) / L;
  spec::StepUses u;
  u.forward.push_back({embed, 0});
  for (int l = 0; l < L; ++l) u.forward.push_back({1 + l, block_flops});
  u.forward.push_back({ln_f, 0});
  u.forward.push_back({embed, head_flops});
  u.backward.push_back({embed, head_flops});
  u.backward.push_back({ln_f, 0, false, true});
  for (int l = L - 1; l >= 0; --l) u.backward.push_back({1 + l, block_flops, true, true});
  u.backward.push_back({embed, 0, false, true});  // the lookup's backward: the embeddings reduce
  return u;
}

}  // namespace

std::shared_ptr<const spec::ModelSpec> Spec(const GptConfig& cfg) { return std::make_shared<GptSpec>(cfg); }

const GptConfig* ConfigOf(const spec::ModelSpec& s) {
  const auto* g = dynamic_cast<const GptSpec*>(&s);
  return g == nullptr ? nullptr : &g->config();
}

}  // namespace strata::gpt
