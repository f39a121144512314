// Everything that needs libtorch, in one translation unit because its headers take most of the
// SDK's build time: the preprocessing (libtorch's own resize ops, so the SDK computes exactly what
// the Python task's array path computes) and the Inductor engine (an AOTInductor package loaded
// with AOTIModelPackageLoader, no Python).
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/headeronly/version.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "engines.h"
#include "failure.h"
#include "preprocess.h"

namespace trtmc::internal {
namespace {

constexpr const char* kPackage = "model.pt2";       // trtmc.backends.inductor.CPU_PACKAGE
constexpr const char* kCudaCache = "inductor-cache.bin";  // trtmc.backends.inductor.CUDA_CACHE

// torchvision's _compute_resized_output_size for one requested size (the shorter side).
std::array<int64_t, 2> shorter_side_to(int64_t size, int64_t height, int64_t width) {
  int64_t shorter = std::min(height, width), longer = std::max(height, width);
  // Python: int(size * long / short), a float64 division truncated.
  auto scaled = static_cast<int64_t>(static_cast<double>(size * longer) / static_cast<double>(shorter));
  return width <= height ? std::array<int64_t, 2>{scaled, size} : std::array<int64_t, 2>{size, scaled};
}

// PreprocessSpec._resize_size followed by torchvision's output-size rule.
std::array<int64_t, 2> resized_size(const PreprocessSpec& spec, int64_t height, int64_t width) {
  auto scale_h = static_cast<int64_t>(std::floor(spec.height / spec.crop_pct));
  auto scale_w = static_cast<int64_t>(std::floor(spec.width / spec.crop_pct));
  if (spec.crop_mode == "squash") return {scale_h, scale_w};
  return shorter_side_to(scale_h, height, width);  // scale_h == scale_w: read_bundle refuses the rest
}

// torch.nn.functional.interpolate as torchvision's F_t.resize calls it (antialias for bilinear
// and bicubic, align_corners=False, no scale factors).
at::Tensor resize(const at::Tensor& nchw, const std::string& interpolation, std::array<int64_t, 2> size) {
  if (interpolation == "bicubic") return at::_upsample_bicubic2d_aa(nchw, size, false, std::nullopt, std::nullopt);
  if (interpolation == "bilinear") return at::_upsample_bilinear2d_aa(nchw, size, false, std::nullopt, std::nullopt);
  return at::upsample_nearest2d(nchw, size, std::nullopt, std::nullopt);
}

// torchvision's center_crop on a tensor: zero padding when the crop is larger, then the crop at
// int(round((size - crop) / 2)) (Python rounds halves to even, as nearbyint does by default).
at::Tensor center_crop(at::Tensor chw, int64_t crop_h, int64_t crop_w) {
  int64_t h = chw.size(1), w = chw.size(2);
  if (crop_w > w || crop_h > h) {
    int64_t left = crop_w > w ? (crop_w - w) / 2 : 0, top = crop_h > h ? (crop_h - h) / 2 : 0;
    int64_t right = crop_w > w ? (crop_w - w + 1) / 2 : 0, bottom = crop_h > h ? (crop_h - h + 1) / 2 : 0;
    chw = at::constant_pad_nd(chw, {left, right, top, bottom}, 0);
    h = chw.size(1), w = chw.size(2);
    if (crop_w == w && crop_h == h) return chw;
  }
  auto top = static_cast<int64_t>(std::nearbyint((h - crop_h) / 2.0));
  auto left = static_cast<int64_t>(std::nearbyint((w - crop_w) / 2.0));
  return chw.slice(1, top, top + crop_h).slice(2, left, left + crop_w);
}

at::ScalarType scalar_type(const std::string& io_dtype) {
  if (io_dtype == "f16") return at::kHalf;
  if (io_dtype == "bf16") return at::kBFloat16;
  return at::kFloat;
}

class InductorEngine final : public Engine {
 public:
  InductorEngine(const std::string& package, const EngineEntry& entry)
      : device_(entry.device == "cuda" ? at::kCUDA : at::kCPU), dtype_(scalar_type(entry.io_dtype)) {
    // AOTIModelPackageLoader takes a path and extracts what it needs while loading, so the
    // temporary copy can go as soon as it is loaded (the Python engine does the same).
    std::string path = write_temporary(package);
    try {
      loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(path);
    } catch (...) {
      std::remove(path.c_str());
      throw;
    }
    std::remove(path.c_str());
  }

  std::vector<float> run(const std::vector<float>& pixels, const std::array<int64_t, 4>& shape) override {
    try {
      at::Tensor input = at::from_blob(const_cast<float*>(pixels.data()), shape, at::kFloat).to(device_, dtype_);
      std::vector<at::Tensor> outputs = loader_->run({input});
      at::Tensor logits = outputs.at(0).to(at::kCPU, at::kFloat).contiguous();
      return std::vector<float>(logits.data_ptr<float>(), logits.data_ptr<float>() + logits.numel());
    } catch (const c10::Error& error) {
      throw Failure(TRTMC_ERROR_INFERENCE, std::string("the AOTInductor engine failed: ") + error.what_without_backtrace());
    }
  }

 private:
  static std::string write_temporary(const std::string& data) {
    const char* folder = std::getenv("TMPDIR");
    std::string path = std::string(folder && *folder ? folder : "/tmp") + "/trtmc-XXXXXX.pt2";
    int fd = mkstemps(path.data(), 4);
    if (fd < 0) throw Failure(TRTMC_ERROR_NO_ENGINE, "cannot create a temporary file for the AOTInductor package in " + path);
    bool written = ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size());
    ::close(fd);
    if (!written) {
      std::remove(path.c_str());
      throw Failure(TRTMC_ERROR_NO_ENGINE, "cannot write the AOTInductor package to " + path + " (disk full?)");
    }
    return path;
  }

  at::Device device_;
  at::ScalarType dtype_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
};

std::string release(const std::string& version) { return version.substr(0, version.find('+')); }

}  // namespace

std::vector<float> preprocess(const PreprocessSpec& spec, const float* pixels, int64_t height, int64_t width) {
  try {
    // HWC memory seen as NCHW (a view, as torch.from_numpy(hwc).permute(2, 0, 1) is in Python).
    at::Tensor image = at::from_blob(const_cast<float*>(pixels), {height, width, 3}, at::kFloat).permute({2, 0, 1});
    std::array<int64_t, 2> size = resized_size(spec, height, width);
    if (size[0] != height || size[1] != width) {  // torchvision returns the image itself when the size matches
      image = resize(image.unsqueeze(0), spec.interpolation, size).squeeze(0);
    }
    image = center_crop(image.clamp(0.0, 1.0), spec.height, spec.width);  // out of place: `pixels` is the caller's
    at::Tensor mean = at::tensor(at::ArrayRef<float>(spec.mean.data(), 3)).view({3, 1, 1});
    at::Tensor std = at::tensor(at::ArrayRef<float>(spec.std.data(), 3)).view({3, 1, 1});
    at::Tensor normalized = ((image - mean) / std).contiguous();
    return std::vector<float>(normalized.data_ptr<float>(), normalized.data_ptr<float>() + normalized.numel());
  } catch (const c10::Error& error) {
    throw Failure(TRTMC_ERROR_INFERENCE, std::string("preprocessing failed: ") + error.what_without_backtrace());
  }
}

std::optional<std::string> inductor_unavailable_reason(const EngineEntry& entry) {
  if (!entry.has_file(kPackage)) {
    if (entry.has_file(kCudaCache)) {
      return std::string(
          "this CUDA inductor engine holds torch.compile caches, which only trtmc's Python runtime replays; the SDK "
          "runs AOTInductor packages (model.pt2): use the Python runtime, or a bundle with an AOTInductor engine");
    }
    return std::string("this inductor engine holds no AOTInductor package (model.pt2); rebuild the bundle");
  }
  if (entry.device == "cuda" && !at::hasCUDA()) {
    return std::string("this engine runs on a CUDA GPU and this machine has none (rebuild with --device cpu)");
  }
  if (entry.device != "cpu" && entry.device != "cuda") {
    return "this engine was built for device '" + entry.device + "', which libtrtmc does not run; rebuild the bundle";
  }
  if (!entry.torch_version.empty() && release(entry.torch_version) != release(TORCH_VERSION)) {
    return "the AOTInductor package was built by torch " + entry.torch_version + " and libtrtmc uses libtorch " +
           TORCH_VERSION + "; rebuild the bundle with this torch, or build the SDK against the torch that built it";
  }
  return std::nullopt;
}

bool cuda_available() { return at::hasCUDA(); }

std::unique_ptr<Engine> load_inductor(const Bundle& bundle, const EngineEntry& entry) {
  try {
    return std::make_unique<InductorEngine>(bundle.engine_file(entry, kPackage), entry);
  } catch (const c10::Error& error) {  // without libtorch's C++ backtrace
    throw Failure(TRTMC_ERROR_NO_ENGINE, error.what_without_backtrace());
  }
}

}  // namespace trtmc::internal
