// Registers the MLP with the model registry (spec/registry.h): the family "mlp", not the default, so that
// `strata plan`, `bench step`, `bench capacity` and `doctor` take it with --model-family mlp. An object
// library, so that the linker keeps it: the root CMakeLists.txt links it into `strata`.
#include "models/mlp/mlp_spec.h"
#include "spec/registry.h"

namespace strata::mlp {
namespace {

const spec::Registration kFamily(MakeMlpFamily(), /*is_default=*/false);

}  // namespace
}  // namespace strata::mlp
