// The bundle's preprocessing contract applied to a host RGB float32 HWC image in [0, 1]: the same
// libtorch ops, in the same order, as the Python task's array path (PreprocessSpec.from_array:
// torchvision's antialiased resize of a tensor, clamp to [0, 1], center crop, (x - mean) / std).
#pragma once

#include <cstdint>
#include <vector>

#include "bundle.h"

namespace trtmc::internal {

// Normalized CHW float32 of shape (3, spec.height, spec.width). The image must already be valid
// (sizes checked, finite, in [0, 1]): c_api.cpp checks it first.
std::vector<float> preprocess(const PreprocessSpec& spec, const float* pixels, int64_t height, int64_t width);

}  // namespace trtmc::internal
