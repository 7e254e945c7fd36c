// `strata doctor` output: one JSON object for machines, an aligned table for people.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/doctor/doctor_facts.h"

namespace strata::tools::doctor {

// The raw facts as JSON (unknown numbers stay as recorded: -1 / 0; an unlimited memlock is "unlimited").
nlohmann::ordered_json FactsToJson(const DoctorFacts& f);

// {"verdict": worst, "counts": {...}, "checks": [{"name", "verdict", "detail"}...], "facts": {...}}
std::string RenderJson(const DoctorFacts& f, const std::vector<CheckResult>& checks);

// A header, one row per check (name, verdict, detail; columns aligned) and a summary line.
std::string RenderTable(const std::vector<CheckResult>& checks);

}  // namespace strata::tools::doctor
