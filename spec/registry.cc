#include "spec/registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::spec {
namespace {

struct Entries {
  std::vector<std::unique_ptr<Family>> families;
  std::vector<const Family*> defaults;
  std::vector<Command> commands;
};

// Registrations run during static initialisation, in any order across files: the table is made on first
// use and never destroyed.
Entries& Table() {
  static Entries* const entries = new Entries();
  return *entries;
}

std::string Names() {
  std::vector<std::string> names;
  for (const Family* f : Families()) names.push_back(f->name());
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

}  // namespace

Registration::Registration(std::unique_ptr<Family> family, bool is_default) {
  Entries& t = Table();
  if (is_default) t.defaults.push_back(family.get());
  t.families.push_back(std::move(family));
}

Registration::Registration(const Command& command) { Table().commands.push_back(command); }

std::vector<const Family*> Families() {
  std::vector<const Family*> out;
  for (const auto& f : Table().families) out.push_back(f.get());
  return out;
}

std::vector<Command> RegisteredCommands() { return Table().commands; }

absl::StatusOr<const Family*> FindFamily(const std::string& name) {
  const Entries& t = Table();
  if (t.families.empty()) return absl::FailedPreconditionError("no model family is registered in this program");
  if (name.empty()) {
    if (t.defaults.size() == 1) return t.defaults[0];
    if (t.defaults.empty() && t.families.size() == 1) return t.families[0].get();
    return absl::FailedPreconditionError(absl::StrCat(t.defaults.size(),
                                                      " default model families among the registered (", Names(),
                                                      "): name one with --model-family"));
  }
  const Family* found = nullptr;
  for (const auto& f : t.families) {
    if (f->name() != name) continue;
    if (found != nullptr)
      return absl::FailedPreconditionError(absl::StrCat("model family '", name, "' is registered twice"));
    found = f.get();
  }
  if (found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--model-family '", name, "': unknown (registered in this binary: ",
                                                   Names(), "; a family is registered by linking its spec::Register "
                                                   "call into the binary, docs/decisions/0035-model-interface.md)"));
  }
  return found;
}

absl::StatusOr<const Family*> TakeFamily(std::vector<std::string>* args) {
  std::string name;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& a = (*args)[i];
    if (a == "--model-family") {
      if (i + 1 >= args->size()) return absl::InvalidArgumentError("flag --model-family needs a value");
      name = (*args)[++i];
      if (name.empty()) return absl::InvalidArgumentError("--model-family is empty");
    } else if (a.rfind("--model-family=", 0) == 0) {
      name = a.substr(a.find('=') + 1);
      if (name.empty()) return absl::InvalidArgumentError("--model-family is empty");
    } else {
      rest.push_back(a);
    }
  }
  *args = std::move(rest);
  return FindFamily(name);
}

const Family* FamilyOfCheckpoint(const std::string& kind) {
  if (kind.empty()) return nullptr;
  for (const Family* f : Families()) {
    if (f->checkpoint_kind() == kind) return f;
  }
  return nullptr;
}

std::string FamilyFlagUsage() {
  const absl::StatusOr<const Family*> d = FindFamily("");
  const std::string left = "--model-family V";
  return absl::StrCat("  ", left, std::string(28 - left.size(), ' '), "the model's family: ", Names(),
                      d.ok() ? absl::StrCat(" (default ", (*d)->name(), ")") : std::string(), "\n");
}

std::string OtherFamiliesUsage() {
  const absl::StatusOr<const Family*> d = FindFamily("");
  std::string s;
  for (const Family* f : Families()) {
    if (d.ok() && *d == f) continue;
    std::string line = absl::StrCat("  with --model-family ", f->name(), ", its flags instead:");
    for (const FlagDef& def : f->TrainFlagDefs()) {
      const std::string flag = " --" + def.name;
      if (line.size() + flag.size() > 110) {
        s += line + "\n";
        line = "   ";
      }
      line += flag;
    }
    s += line + "\n";
  }
  return s;
}

std::string TrainFlagsUsage() {
  const absl::StatusOr<const Family*> d = FindFamily("");
  if (!d.ok()) return FamilyFlagUsage() + OtherFamiliesUsage();
  const std::string usage = Flags::Usage("train", (*d)->TrainFlagDefs());
  return FamilyFlagUsage() + usage.substr(usage.find('\n') + 1) + OtherFamiliesUsage();
}

}  // namespace strata::spec
