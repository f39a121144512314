// Choosing the engine, as trtmc.runtime.choose_engine does.
#include "engines.h"

#include <algorithm>

#include "failure.h"

namespace trtmc::internal {
namespace {

// The Python runtime's BACKENDS order: a TensorRT plan wherever one can run, then Inductor, the
// uncompiled reference graph last.
const std::vector<std::string> kBackendOrder = {"tensorrt", "inductor", "reference"};

size_t rank(const EngineEntry& entry) {
  auto found = std::find(kBackendOrder.begin(), kBackendOrder.end(), entry.backend);
  return static_cast<size_t>(found - kBackendOrder.begin());  // unknown backends last
}

std::optional<std::string> unavailable_reason(const EngineEntry& entry) {
  if (entry.backend == "tensorrt") return tensorrt_unavailable_reason(entry);
  if (entry.backend == "inductor") return inductor_unavailable_reason(entry);
  if (entry.backend == "reference") {
    return std::string("the reference engine runs the graph op by op in Python; libtrtmc runs tensorrt and inductor engines");
  }
  return "unknown backend '" + entry.backend + "'; libtrtmc runs tensorrt and inductor engines (a newer one may run it)";
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

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
    std::optional<std::string> reason = unavailable_reason(*entry);
    if (!reason) {
      try {
        chosen.engine = load(bundle, *entry);
        chosen.key = entry->key;
        return chosen;
      } catch (const std::bad_alloc&) {
        throw;
      } catch (const std::exception& error) {  // native loaders throw anything: it did not load
        reason = "it failed to load (" + first_line(error.what()) + ")";
      }
    }
    chosen.skipped.push_back("engine " + entry->key + " cannot run here: " + *reason);
  }
  std::string lines;
  for (const std::string& line : chosen.skipped) lines += (lines.empty() ? "" : "; ") + line;
  throw Failure(TRTMC_ERROR_NO_ENGINE, bundle.path + ": no engine in this bundle can run on this machine (" + lines +
                                           "); rebuild the bundle here, e.g. `trtmc build MODEL -o OUT --device " +
                                           (cuda_available() ? "cuda" : "cpu") + "`");
}

#ifndef TRTMC_WITH_TENSORRT
std::optional<std::string> tensorrt_unavailable_reason(const EngineEntry&) {
  return std::string(
      "this libtrtmc was built without TensorRT (no TensorRT headers were found when it was configured); "
      "configure the SDK with TensorRT installed (-DTensorRT_ROOT=DIR) or use another engine");
}

std::unique_ptr<Engine> load_tensorrt(const Bundle&, const EngineEntry& entry) {
  throw Failure(TRTMC_ERROR_NO_ENGINE, *tensorrt_unavailable_reason(entry));
}
#endif

}  // namespace trtmc::internal
