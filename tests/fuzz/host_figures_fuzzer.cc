// Fuzzes the reader of `strata plan --host-figures FILE` (tools/plan/plan_host_figures.cc): a report of
// `strata doctor --measure --json` that came from outside. Input: the whole file. Properties beyond "no
// crash, leak or UB":
//  - ReadHostFigures (the file, through /proc/self/fd) and ParseHostFigures (the text) agree;
//  - every rejection names the file and is DataLoss (JsonReader's fields, ParseUntrustedJson's "not
//    JSON") or InvalidArgument (the nesting guard before the parser, runtime/base/json_text.h; the size
//    guard, which the fuzz inputs stay under); never Internal, never without a message;
//  - an accepted report's numbers are the document's exactly (json_exact.h for the integers; the rates are
//    the document's doubles, finite and in [0, 1e9)); comm_error is its text;
//  - ApplyHostFigures over a few job shapes either sets positive finite rates wherever it read one, or is
//    InvalidArgument naming the file and a facts.host_figures key.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "tests/fuzz/fuzz_file.h"
#include "tests/fuzz/json_exact.h"
#include "spec/flags.h"
#include "tools/plan/plan_device.h"
#include "tools/plan/plan_host_figures.h"

namespace {

using strata::fuzz::ExpectExact;
using strata::tools::plan::HostFigures;

void ExpectNamedError(const absl::Status& s, std::initializer_list<absl::StatusCode> codes, const std::string& where) {
  bool known = false;
  for (absl::StatusCode c : codes) known = known || s.code() == c;
  STRATA_FUZZ_EXPECT(known && s.message().find(where) != std::string_view::npos, "unexpected error (naming %s?): %s",
                     where.c_str(), s.ToString().c_str());
}

void ExpectSameRate(const nlohmann::json& h, const char* key, double parsed) {
  STRATA_FUZZ_EXPECT(std::isfinite(parsed) && parsed >= 0 && parsed < 1e9, "%s = %g accepted", key, parsed);
  const auto it = h.find(key);
  STRATA_FUZZ_EXPECT(
      it != h.end() && it->is_number() && it->get<double>() == parsed, "accepted %s = %.17g, but the document says %s",
      key, parsed,
      it == h.end() ? "nothing" : it->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

// An accepted report against the document itself (parsed again here, trusting nothing of the reader's).
void ExpectDocumentValues(std::string_view text, const HostFigures& f) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  STRATA_FUZZ_EXPECT(j.is_object(), "accepted a document that is not a JSON object");
  const nlohmann::json& facts = j.at("facts");
  const nlohmann::json& h = facts.at("host_figures");
  ExpectExact(facts, "cpu_cores", f.cpu_cores, "facts");
  ExpectExact(h, "ranks", f.ranks, "facts.host_figures");
  STRATA_FUZZ_EXPECT(f.ranks >= 1 && f.cpu_cores >= 0, "ranks %d, cpu_cores %d", f.ranks, f.cpu_cores);
  ExpectSameRate(h, "matmul_gflops", f.matmul_gflops);
  ExpectSameRate(h, "matmul_gflops_one_rank", f.matmul_gflops_one_rank);
  ExpectSameRate(h, "update_gbps", f.update_gbps);
  ExpectSameRate(h, "allgather_gbps", f.allgather_gbps);
  ExpectSameRate(h, "reduce_scatter_gbps", f.reduce_scatter_gbps);
  ExpectSameRate(h, "allreduce_gbps", f.allreduce_gbps);
  ExpectSameRate(h, "alpha_us", f.alpha_us);
  const auto e = h.find("comm_error");
  STRATA_FUZZ_EXPECT(e != h.end() && e->is_string() && e->get<std::string>() == f.comm_error,
                     "comm_error is not the document's text");
}

bool Same(const HostFigures& a, const HostFigures& b) {
  return a.ranks == b.ranks && a.cpu_cores == b.cpu_cores && a.matmul_gflops == b.matmul_gflops &&
         a.matmul_gflops_one_rank == b.matmul_gflops_one_rank && a.update_gbps == b.update_gbps &&
         a.allgather_gbps == b.allgather_gbps && a.reduce_scatter_gbps == b.reduce_scatter_gbps &&
         a.allreduce_gbps == b.allreduce_gbps && a.alpha_us == b.alpha_us && a.comm_error == b.comm_error;
}

bool PositiveFinite(double v) { return std::isfinite(v) && v > 0; }

// The plan's use of the figures, with no flag given: for each job shape, every rate it set is positive and
// finite, or the error names the file and the key.
void ExpectApply(const HostFigures& f, const std::string& where) {
  static const strata::spec::Flags* const no_flags = [] {
    auto parsed = strata::spec::Flags::Parse({}, {});
    STRATA_FUZZ_EXPECT(parsed.ok(), "Flags::Parse of nothing: %s", parsed.status().ToString().c_str());
    return new strata::spec::Flags(*parsed);
  }();
  const int shapes[][2] = {{1, 1}, {f.ranks, f.ranks}, {2 * f.ranks, f.ranks}, {4, 2}, {8, 8}};
  for (const auto& s : shapes) {
    auto preset = strata::tools::plan::DevicePreset("host");
    STRATA_FUZZ_EXPECT(preset.ok(), "DevicePreset(host): %s", preset.status().ToString().c_str());
    strata::tools::plan::DeviceSpec d = *preset;
    const absl::Status st = strata::tools::plan::ApplyHostFigures(f, where, s[0], s[1], *no_flags, &d);
    if (!st.ok()) {
      ExpectNamedError(st, {absl::StatusCode::kInvalidArgument}, where);
      STRATA_FUZZ_EXPECT(st.message().find("facts.host_figures.") != std::string_view::npos,
                         "error names no key: %s", st.ToString().c_str());
      continue;
    }
    STRATA_FUZZ_EXPECT(PositiveFinite(d.matmul_flops) && PositiveFinite(d.host_memory_bytes_per_s),
                       "accepted a job of %d ranks (%d per node) with matmul %g, update %g", s[0], s[1],
                       d.matmul_flops, d.host_memory_bytes_per_s);
    STRATA_FUZZ_EXPECT(d.cores_per_node == f.cpu_cores, "cores_per_node %d, the report says %d", d.cores_per_node,
                       f.cpu_cores);
    if (s[0] > 1 && s[1] > 1) {
      STRATA_FUZZ_EXPECT(PositiveFinite(d.intra.all_gather_bytes_per_s) &&
                             PositiveFinite(d.intra.reduce_scatter_bytes_per_s) &&
                             PositiveFinite(d.intra.all_reduce_bytes_per_s),
                         "accepted a job of %d ranks (%d per node) without its collectives' rates", s[0], s[1]);
      STRATA_FUZZ_EXPECT(std::isfinite(d.intra.alpha_s) && d.intra.alpha_s >= 0, "alpha %g", d.intra.alpha_s);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static strata::fuzz::MemFile* const file = new strata::fuzz::MemFile();
  file->Set(data, size);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string& where = file->path();
  auto from_file = strata::tools::plan::ReadHostFigures(where);
  auto from_text = strata::tools::plan::ParseHostFigures(absl::string_view(text.data(), text.size()), where);
  STRATA_FUZZ_EXPECT(from_file.ok() == from_text.ok() && from_file.status().code() == from_text.status().code(),
                     "the file reads %s, the text %s", from_file.status().ToString().c_str(),
                     from_text.status().ToString().c_str());
  if (!from_text.ok()) {
    ExpectNamedError(from_text.status(), {absl::StatusCode::kDataLoss, absl::StatusCode::kInvalidArgument}, where);
    return 0;
  }
  STRATA_FUZZ_EXPECT(Same(*from_file, *from_text), "the file and the text give different figures");
  ExpectDocumentValues(text, *from_text);
  ExpectApply(*from_text, where);
  return 0;
}
