// `strata generate`: samples text from trained weights (single process, evaluation passes).
// Byte-vocabulary models print text; larger vocabularies print token ids (no BPE tokenizer here).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "models/gpt/model/gpt_model.h"
#include "models/gpt/train/commands.h"
#include "models/gpt/train/model_flags.h"
#include "models/gpt/weights/weights.h"
#include "runtime/base/status.h"
#include "runtime/comm/in_process.h"
#include "runtime/device/host_device.h"

namespace strata::tools {
namespace {

// Samples from softmax(logits / temperature) restricted to the top k.
int Sample(std::vector<float> logits, double temperature, int top_k, std::mt19937_64& rng) {
  const int V = static_cast<int>(logits.size());
  if (temperature <= 0) return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int> idx(V);
  for (int i = 0; i < V; ++i) idx[i] = i;
  const int k = top_k > 0 ? std::min(top_k, V) : V;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<double> p(k);
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += p[i] = std::exp((logits[idx[i]] - logits[idx[0]]) / temperature);
  double u = std::uniform_real_distribution<double>(0, sum)(rng);
  for (int i = 0; i < k; ++i) {
    if ((u -= p[i]) <= 0) return idx[i];
  }
  return idx[k - 1];
}

absl::Status Generate(const spec::Flags& f) {
  STRATA_ASSIGN_OR_RETURN(gpt::GptConfig cfg, ModelFromFlags(f));
  const std::string weights = f.Str("init-from");
  if (weights.empty()) {
    return absl::InvalidArgumentError(
        "strata generate needs --init-from WEIGHTS (a .safetensors file or a Hugging Face directory)");
  }
  STRATA_ASSIGN_OR_RETURN(int64_t n, f.Int("tokens", 200));
  STRATA_ASSIGN_OR_RETURN(double temperature, f.Double("temperature", 0.8));
  STRATA_ASSIGN_OR_RETURN(int64_t top_k, f.IntIn("top-k", 40, 0, std::numeric_limits<int>::max()));
  STRATA_ASSIGN_OR_RETURN(int64_t seed, f.Int("seed", 1));
  auto comms = comm::CreateInProcessGroup(1, comm::Options{});
  device::HostDevice dev;
  engine::EngineConfig ec;
  ec.stage = 0;
  STRATA_ASSIGN_OR_RETURN(auto e, engine::Engine::Create(ec, *comms[0], dev));
  STRATA_ASSIGN_OR_RETURN(gpt::GptModel model, gpt::GptModel::Register(*e, cfg));
  STRATA_RETURN_IF_ERROR(e->Finalize());
  STRATA_RETURN_IF_ERROR(gpt::LoadWeights(*e, model, weights));
  std::vector<int32_t> tokens;
  const std::string prompt = f.Str("prompt", "\n");
  for (unsigned char ch : prompt) tokens.push_back(cfg.vocab >= 256 ? ch : ch % cfg.vocab);
  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  const bool bytes = cfg.vocab <= 256;
  std::fputs(prompt.c_str(), stdout);
  for (int64_t i = 0; i < n; ++i) {
    const int T = std::min<int>(static_cast<int>(tokens.size()), cfg.seq_len);
    std::vector<float> logits;
    STRATA_RETURN_IF_ERROR(model.Forward(*e, tokens.data() + tokens.size() - T, nullptr, 1, T, &logits).status());
    const int next = Sample(std::move(logits), temperature, static_cast<int>(top_k), rng);
    tokens.push_back(next);
    if (bytes) {
      std::fputc(next >= 32 || next == '\n' ? next : '?', stdout);
    } else {
      std::printf(" %d", next);
    }
    std::fflush(stdout);
  }
  std::fputc('\n', stdout);
  return absl::OkStatus();
}

std::vector<spec::FlagDef> GenerateFlagDefs() {
  std::vector<spec::FlagDef> defs = ModelFlagDefs();
  defs.insert(defs.end(), {{"init-from", false, "weights to sample from (.safetensors or a HF directory)"},
                           {"prompt", false, "text to continue (default: a newline)"},
                           {"tokens", false, "tokens to generate (default 200)"},
                           {"temperature", false, "softmax temperature (default 0.8; 0 = greedy)"},
                           {"top-k", false, "sample among the k most likely (default 40; 0 = all)"},
                           {"seed", false, "sampling seed"}});
  return defs;
}

}  // namespace

std::string GenerateUsage() { return spec::Flags::Usage("generate", GenerateFlagDefs()); }

int GenerateCommand(const std::vector<std::string>& args) {
  auto f = spec::Flags::Parse(args, GenerateFlagDefs());
  absl::Status s = f.ok() ? Generate(*f) : f.status();
  if (!s.ok()) {
    std::fprintf(stderr, "strata generate: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace strata::tools
