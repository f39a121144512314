// Choosing the engine, as trtmc.runtime.choose_engine does.
#include "engines.h"

#include <algorithm>

#include "failure.h"

namespace trtmc::internal {
namespace {

// The Python runtime's BACKENDS order: a TensorRT plan wherever one can run, then Inductor.
const std::vector<std::string> kBackendOrder = {"tensorrt", "inductor"};

size_t rank(const EngineEntry& entry) {
  auto found = std::find(kBackendOrder.begin(), kBackendOrder.end(), entry.backend);
  return static_cast<size_t>(found - kBackendOrder.begin());  // unknown backends last
}

std::optional<std::string> unavailable_reason(const EngineEntry& entry) {
  if (entry.backend == "tensorrt") return tensorrt_unavailable_reason(entry);
  if (entry.backend == "inductor") return inductor_unavailable_reason(entry);
  return "unknown backend '" + entry.backend + "' (libtrtmc runs tensorrt and inductor engines); rebuild the bundle";
}

std::unique_ptr<Engine> load(const Bundle& bundle, const EngineEntry& entry) {
  return entry.backend == "tensorrt" ? load_tensorrt(bundle, entry) : load_inductor(bundle, entry);
}

}  // namespace

ChosenEngine load_first_engine(const Bundle& bundle) {
  if (bundle.engines.empty()) {
    throw Failure(TRTMC_ERROR_NO_ENGINE,
                  bundle.path + ": the bundle holds no engine; rebuild with `trtmc build ... --backend inductor`");
  }
  std::vector<const EngineEntry*> order;
  for (const EngineEntry& entry : bundle.engines) order.push_back(&entry);
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return rank(*a) < rank(*b); });
  ChosenEngine chosen;
  for (const EngineEntry* entry : order) {
    if (std::optional<std::string> reason = unavailable_reason(*entry)) {
      chosen.skipped.push_back("engine " + entry->key + " cannot run here: " + *reason);
      continue;
    }
    chosen.engine = load(bundle, *entry);
    chosen.key = entry->key;
    return chosen;
  }
  std::string lines;
  for (const std::string& line : chosen.skipped) lines += "\n  " + line;
  throw Failure(TRTMC_ERROR_NO_ENGINE, bundle.path + ": no engine in this bundle can run on this machine:" + lines +
                                           "\nRebuild the bundle for this machine (e.g. `trtmc build MODEL -o OUT "
                                           "--device cpu`).");
}

#ifndef TRTMC_WITH_TENSORRT
std::optional<std::string> tensorrt_unavailable_reason(const EngineEntry&) {
  return std::string(
      "this libtrtmc was built without TensorRT (no TensorRT headers were found when it was configured); "
      "configure the SDK with TensorRT installed (-DTensorRT_ROOT=DIR) or use another engine");
}

std::unique_ptr<Engine> load_tensorrt(const Bundle& bundle, const EngineEntry& entry) {
  throw Failure(TRTMC_ERROR_NO_ENGINE, bundle.path + ": engine " + entry.key + ": " + *tensorrt_unavailable_reason(entry));
}
#endif

}  // namespace trtmc::internal
