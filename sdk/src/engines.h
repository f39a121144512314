// Engines and how one is chosen, as trtmc's Python runtime chooses (src/trtmc/runtime.py): TensorRT
// plans first, then Inductor, then the rest, each backend's engines in the bundle's order. Loading
// is part of choosing: an engine that cannot run here and one that fails to load are both passed
// over with one line saying why, and the next one is tried.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bundle.h"

namespace trtmc::internal {

// A loaded engine: normalized NCHW float32 host pixels in, float32 logits [N, classes] out.
class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::vector<float> run(const std::vector<float>& pixels, const std::array<int64_t, 4>& shape) = 0;
};

struct ChosenEngine {
  std::unique_ptr<Engine> engine;
  std::string key;
  std::vector<std::string> skipped;  // "engine KEY cannot run here: REASON"
};

// Throws Failure(TRTMC_ERROR_NO_ENGINE) listing every reason when no engine can run here.
ChosenEngine load_first_engine(const Bundle& bundle);

// Whether libtorch sees a CUDA GPU (the advice in the no-engine message depends on it).
bool cuda_available();

// Each backend: why an engine cannot run here (nullopt when it can), and loading it (a failure to
// load throws Failure, or whatever the native loader throws).
std::optional<std::string> inductor_unavailable_reason(const EngineEntry& entry);
std::unique_ptr<Engine> load_inductor(const Bundle& bundle, const EngineEntry& entry);
std::optional<std::string> tensorrt_unavailable_reason(const EngineEntry& entry);
std::unique_ptr<Engine> load_tensorrt(const Bundle& bundle, const EngineEntry& entry);

}  // namespace trtmc::internal
