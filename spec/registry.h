// The registry of model families and of their commands. A model registers itself from an object library
// (a static Registration), which the executable links: the root CMakeLists.txt links each model's into
// `strata`, a test its own; tools/ finds them here and never names a model (docs/decisions/0035).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "spec/command.h"
#include "spec/family.h"

namespace strata::spec {

struct Registration {
  // A family; `is_default` when the tools take it without --model-family (the flagship).
  Registration(std::unique_ptr<Family> family, bool is_default);
  // A command of a model family, listed before the CLI's own in registration order.
  explicit Registration(const Command& command);
};

std::vector<const Family*> Families();
std::vector<Command> RegisteredCommands();

// The family named `name`; "" means the default: the one registered as such, else the only one. An error
// names the registered families.
absl::StatusOr<const Family*> FindFamily(const std::string& name);
// --model-family NAME (or --model-family=NAME) taken out of `args`, and that family (the default without it).
absl::StatusOr<const Family*> TakeFamily(std::vector<std::string>* args);
// The family whose checkpoints name `kind` as their model_kind, nullptr for none.
const Family* FamilyOfCheckpoint(const std::string& kind);
// The usage line of --model-family, naming the registered families.
std::string FamilyFlagUsage();
// For each family but the default, one line (wrapped) naming its trainer flags: "with --model-family mlp,
// its flags instead: --in --hidden ...". Empty when the default is the only one.
std::string OtherFamiliesUsage();
// FamilyFlagUsage's line, then the default family's trainer flags as Flags::Usage lists them (without its
// first line), then OtherFamiliesUsage: what a command that also takes a family's flags lists after its own.
std::string TrainFlagsUsage();

}  // namespace strata::spec
