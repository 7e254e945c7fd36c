// `strata ckpt inspect DIR [--verify]` and `strata ckpt export DIR -o FILE.safetensors | OUTDIR`.
// DIR is a step directory or a checkpoint directory (its latest complete step is used). Both read through
// checkpoint/consolidate.h, which validates the manifest and confines every file to the step directory.
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/checkpoint/pretrained.h"
#include "runtime/checkpoint/safetensors.h"
#include "spec/flags.h"
#include "spec/registry.h"
#include "tools/cli/commands.h"

namespace strata::tools {
namespace {

// The model family whose checkpoint this is (its trainer state's "model_kind"), nullptr for none registered.
const spec::Family* FamilyOf(const checkpoint::Manifest& m) {
  auto j = nlohmann::json::parse(m.trainer_json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return nullptr;
  const auto kind = j.find("model_kind");  // the trainer state is the checkpoint's: any type may be there
  return kind != j.end() && kind->is_string() ? spec::FamilyOfCheckpoint(kind->get<std::string>()) : nullptr;
}

absl::Status Inspect(const std::string& dir, bool verify) {
  STRATA_ASSIGN_OR_RETURN(std::string step_dir, checkpoint::ResolveCheckpoint(dir));
  STRATA_ASSIGN_OR_RETURN(checkpoint::Manifest m, checkpoint::ReadManifest(step_dir));
  uint64_t params = 0, frozen = 0, bytes = 0;
  for (const auto& u : m.units) {
    for (const auto& p : u.params) (p.frozen ? frozen : params) += p.numel;
  }
  params += frozen;
  for (const auto& s : m.shards) bytes += s.bytes;
  const std::string replicas = m.replicas > 1 ? absl::StrCat(" (shard groups of ", m.world_size, " ranks, ", m.replicas,
                                                             " replicas: ", m.world_size * m.replicas, " ranks)")
                                              : "";
  std::printf("checkpoint %s\n  format version %d, step %lld, world size %d%s, ZeRO stage %d, param dtype %s, "
              "optimizer %s, loss scale %g\n  %zu units, %llu parameters%s, %zu shard files, %s\n  trainer state: %s\n",
              step_dir.c_str(), m.version, static_cast<long long>(m.step), m.world_size, replicas.c_str(), m.stage,
              m.param_dtype.c_str(),
              m.optimizer.c_str(), m.loss_scale, m.units.size(), static_cast<unsigned long long>(params),
              frozen == 0 ? "" : absl::StrCat(" (", frozen, " frozen)").c_str(), m.shards.size(),
              FormatBytes(bytes).c_str(), m.trainer_json.c_str());
  if (verify) {
    STRATA_ASSIGN_OR_RETURN(checkpoint::VerifyReport r, checkpoint::VerifyCheckpoint(step_dir, m));
    std::printf("  verify: ok (%llu files, %llu ranges, %s, every checksum matches)\n",
                static_cast<unsigned long long>(r.files), static_cast<unsigned long long>(r.ranges),
                FormatBytes(r.bytes).c_str());
  }
  return absl::OkStatus();
}

absl::Status Export(const std::string& dir, const std::string& out, const std::string& max_shard) {
  STRATA_ASSIGN_OR_RETURN(std::string step_dir, checkpoint::ResolveCheckpoint(dir));
  STRATA_ASSIGN_OR_RETURN(checkpoint::Manifest m, checkpoint::ReadManifest(step_dir));
  // A manifest that lists fewer parameters than its shards hold would export a partial model.
  STRATA_RETURN_IF_ERROR(checkpoint::CheckCoverage(step_dir, m));
  const spec::Family* family = FamilyOf(m);  // its names (the GPT: Hugging Face's), else unit.param
  std::vector<checkpoint::TensorToWrite> tensors;
  std::vector<std::pair<size_t, size_t>> where;  // each tensor's (unit, parameter)
  for (size_t u = 0; u < m.units.size(); ++u) {
    for (size_t p = 0; p < m.units[u].params.size(); ++p) {
      const auto& unit = m.units[u];
      const std::string name = family != nullptr ? family->ExportName(unit.name, unit.params[p].name)
                                                 : absl::StrCat(unit.name, ".", unit.params[p].name);
      tensors.push_back({name, unit.params[p].shape});
      where.emplace_back(u, p);
    }
  }
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"producer", "strata ckpt export"}, {"step", absl::StrCat(m.step)}};
  // Each parameter read from the shards and handed to the writer in turn: one is in memory at a time.
  auto write_params = [&](auto& writer) -> absl::Status {
    for (const auto& [u, p] : where) {
      STRATA_ASSIGN_OR_RETURN(const std::vector<float> values, checkpoint::ReadMasterParam(step_dir, m, u, p));
      STRATA_RETURN_IF_ERROR(writer.WriteTensor(values));
    }
    return absl::OkStatus();
  };
  // OUT.safetensors: one file. Anything else: a directory in Hugging Face's layout, shards of at most
  // --max-shard-size with an index (docs/decisions/0037).
  const bool one_file = out.size() > 12 && out.compare(out.size() - 12, 12, ".safetensors") == 0;
  std::string where_to = out;
  if (one_file) {
    if (!max_shard.empty()) {
      return absl::InvalidArgumentError("--max-shard-size is for a directory export (-o DIR), not -o FILE.safetensors");
    }
    STRATA_ASSIGN_OR_RETURN(checkpoint::SafetensorsWriter writer,
                            checkpoint::SafetensorsWriter::Begin(out, tensors, metadata));
    STRATA_RETURN_IF_ERROR(write_params(writer));
    STRATA_RETURN_IF_ERROR(writer.Finish());
  } else {
    STRATA_ASSIGN_OR_RETURN(const uint64_t max_bytes, ParseBytes(max_shard.empty() ? "50GB" : max_shard));
    if (max_bytes == 0) return absl::InvalidArgumentError("--max-shard-size must be positive");
    STRATA_ASSIGN_OR_RETURN(checkpoint::SafetensorsDirWriter writer,
                            checkpoint::SafetensorsDirWriter::Begin(out, tensors, max_bytes, metadata));
    STRATA_RETURN_IF_ERROR(write_params(writer));
    STRATA_ASSIGN_OR_RETURN(const std::vector<std::string> files, writer.Finish());
    where_to = absl::StrCat(out, " (", absl::StrJoin(files, ", "), ")");
  }
  std::printf(
      "exported %zu tensors of step %lld to %s%s\n", tensors.size(), static_cast<long long>(m.step), where_to.c_str(),
      family != nullptr && !family->export_names().empty() ? absl::StrCat(" (", family->export_names(), ")").c_str()
                                                           : "");
  return absl::OkStatus();
}

const std::vector<spec::FlagDef>& CkptFlagDefs() {
  static const auto* defs =
      new std::vector<spec::FlagDef>{{"verify", true, "inspect: check every checksum"},
                                     {"o", false, "export: the output .safetensors or directory (also -o)"},
                                     {"max-shard-size", false, "export to a directory: bytes per file (default 50GB)"}};
  return *defs;
}

}  // namespace

std::string CkptUsage() {
  return "usage: strata ckpt inspect DIR [--verify]     what a checkpoint holds (DIR: a checkpoint directory\n"
         "                                                or one of its step_* directories)\n"
         "       strata ckpt export DIR -o FILE.safetensors   consolidated fp32 weights (GPT: Hugging Face names)\n"
         "       strata ckpt export DIR -o OUTDIR [--max-shard-size 5GB]   the same in Hugging Face's layout\n"
         "                                                (model.safetensors, or shards and their index)\n" +
         spec::Flags::Usage("ckpt", CkptFlagDefs()).substr(spec::Flags::Usage("ckpt", {}).size());
}

int CkptCommand(const std::vector<std::string>& args) {
  std::vector<std::string> a = args;
  for (auto& x : a) x = x == "-o" ? "--o" : x;
  auto f = spec::Flags::Parse(a, CkptFlagDefs());
  absl::Status s = f.status();
  if (s.ok()) {
    const auto& pos = f->positional();
    if (pos.size() == 2 && pos[0] == "inspect") {
      s = Inspect(pos[1], f->Bool("verify"));
    } else if (pos.size() == 2 && pos[0] == "export" && f->Has("o")) {
      s = Export(pos[1], f->Str("o"), f->Str("max-shard-size"));
    } else {
      s = absl::InvalidArgumentError(CkptUsage());
    }
  }
  if (!s.ok()) {
    std::fprintf(stderr, "strata ckpt: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace strata::tools
