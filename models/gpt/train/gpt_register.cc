// Registers the GPT with the model registry (spec/registry.h): the default family, and its commands
// `strata train` and `strata generate` (with MPI, as the CLI). An object library, so that the linker keeps
// it: the root CMakeLists.txt links it into `strata`, and the tests that read `strata train`'s flags
// through the registry link it too.
#include "models/gpt/train/gpt_family.h"
#include "spec/registry.h"
#if STRATA_WITH_MPI
#include "models/gpt/train/commands.h"
#endif

namespace strata::gpt {
namespace {

const spec::Registration kFamily(MakeFamily(), /*is_default=*/true);
#if STRATA_WITH_MPI
const spec::Registration kTrain(spec::Command{"train", "train a GPT-2 on the engine (under mpirun for several ranks)",
                                              tools::TrainCommand, tools::TrainUsage});
const spec::Registration kGenerate(spec::Command{"generate", "sample text from trained weights", tools::GenerateCommand,
                                                 tools::GenerateUsage});
#endif

}  // namespace
}  // namespace strata::gpt
