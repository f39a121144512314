// TensorRT plans through the TensorRT C++ runtime (full TensorRT's libnvinfer, or TensorRT-RTX's
// libtensorrt_rtx: CMake links whichever it found and names it in TRTMC_TENSORRT_BUILDER). Compiled
// only when CMake finds TensorRT's headers; the checks mirror trtmc.backends.tensorrt.unavailable_reason.
#include <NvInfer.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <utility>

#include "engines.h"
#include "failure.h"

namespace trtmc::internal {
namespace {

constexpr const char* kPlan = "engine.plan";  // trtmc.backends.tensorrt.PLAN_FILE
constexpr const char* kInput = "pixels";      // trtmc.backends.tensorrt_lowering.INPUT_NAME
constexpr const char* kOutput = "logits";     // trtmc.backends.tensorrt_lowering.OUTPUT_NAME
// What a TensorRT-RTX plan built with the default builder config runs on ("12.x": any 12.y).
const std::vector<std::string> kRtxDefaultTargets = {"8.0", "8.6", "8.9", "12.x"};

#define TRTMC_STR2(x) #x
#define TRTMC_STR(x) TRTMC_STR2(x)
#ifdef TRT_MAJOR_RTX
constexpr const char* kVersion = TRTMC_STR(TRT_MAJOR_RTX) "." TRTMC_STR(TRT_MINOR_RTX) "." TRTMC_STR(TRT_PATCH_RTX);
#else
constexpr const char* kVersion = TRTMC_STR(NV_TENSORRT_MAJOR) "." TRTMC_STR(NV_TENSORRT_MINOR) "." TRTMC_STR(NV_TENSORRT_PATCH);
#endif

// major.minor.patch: plans load only with the TensorRT release that built them.
std::string release(const std::string& version) {
  size_t dots = 0, end = 0;
  while (end < version.size() && !(version[end] == '.' && ++dots == 3)) ++end;
  return version.substr(0, end);
}

class Logger final : public nvinfer1::ILogger {
 public:
  void log(Severity severity, const char* message) noexcept override {
    if (severity > Severity::kERROR) return;
    std::lock_guard<std::mutex> lock(mutex_);
    errors_ += std::string(errors_.empty() ? "TensorRT: " : "; ") + message;
  }
  std::string take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(errors_, "");
  }

 private:
  std::mutex mutex_;
  std::string errors_;
};

Logger& logger() {
  static Logger instance;  // TensorRT may keep the first logger it was given: one per process
  return instance;
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Failure(TRTMC_ERROR_INFERENCE, std::string(what) + " failed: " + cudaGetErrorString(status));
  }
}

struct DeviceBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  ~DeviceBuffer() { cudaFree(data); }
  void reserve(size_t needed) {
    if (needed <= bytes) return;
    cudaFree(data);
    data = nullptr;
    bytes = 0;
    check_cuda(cudaMalloc(&data, needed), "cudaMalloc");
    bytes = needed;
  }
};

size_t element_size(nvinfer1::DataType type) {
  switch (type) {
    case nvinfer1::DataType::kFLOAT: return 4;
    case nvinfer1::DataType::kHALF:
    case nvinfer1::DataType::kBF16: return 2;
    default: throw Failure(TRTMC_ERROR_NO_ENGINE, "the plan's input or output type is not f32, f16 or bf16");
  }
}

// Host float32 <-> the plan's I/O type, converted on the host (a 224x224 image is 150k values).
std::vector<unsigned char> to_device_type(const std::vector<float>& values, nvinfer1::DataType type) {
  std::vector<unsigned char> out(values.size() * element_size(type));
  for (size_t i = 0; i < values.size(); ++i) {
    if (type == nvinfer1::DataType::kFLOAT) reinterpret_cast<float*>(out.data())[i] = values[i];
    if (type == nvinfer1::DataType::kHALF) reinterpret_cast<__half*>(out.data())[i] = __float2half(values[i]);
    if (type == nvinfer1::DataType::kBF16) reinterpret_cast<__nv_bfloat16*>(out.data())[i] = __float2bfloat16(values[i]);
  }
  return out;
}

std::vector<float> from_device_type(const std::vector<unsigned char>& raw, nvinfer1::DataType type) {
  std::vector<float> out(raw.size() / element_size(type));
  for (size_t i = 0; i < out.size(); ++i) {
    if (type == nvinfer1::DataType::kFLOAT) out[i] = reinterpret_cast<const float*>(raw.data())[i];
    if (type == nvinfer1::DataType::kHALF) out[i] = __half2float(reinterpret_cast<const __half*>(raw.data())[i]);
    if (type == nvinfer1::DataType::kBF16) out[i] = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(raw.data())[i]);
  }
  return out;
}

class TensorRTEngine final : public Engine {
 public:
  explicit TensorRTEngine(const std::string& plan) {
    logger().take();
    runtime_.reset(nvinfer1::createInferRuntime(logger()));
    if (runtime_) engine_.reset(runtime_->deserializeCudaEngine(plan.data(), plan.size()));
    if (engine_) context_.reset(engine_->createExecutionContext());
    if (!context_) {
      throw Failure(TRTMC_ERROR_NO_ENGINE, "TensorRT could not load the plan (" + logger().take() + ")");
    }
    check_cuda(cudaStreamCreate(&stream_), "cudaStreamCreate");
  }
  ~TensorRTEngine() override {
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::vector<float> run(const std::vector<float>& pixels, const std::array<int64_t, 4>& shape) override {
    nvinfer1::DataType in_type = engine_->getTensorDataType(kInput), out_type = engine_->getTensorDataType(kOutput);
    nvinfer1::Dims4 dims(shape[0], shape[1], shape[2], shape[3]);
    if (!context_->setInputShape(kInput, dims)) {
      throw Failure(TRTMC_ERROR_INFERENCE, "the plan does not take a batch of this shape (" + logger().take() + ")");
    }
    nvinfer1::Dims out_dims = context_->getTensorShape(kOutput);
    size_t outputs = 1;
    for (int i = 0; i < out_dims.nbDims; ++i) outputs *= static_cast<size_t>(out_dims.d[i]);
    std::vector<unsigned char> input = to_device_type(pixels, in_type);
    std::vector<unsigned char> output(outputs * element_size(out_type));
    input_.reserve(input.size());
    output_.reserve(output.size());
    check_cuda(cudaMemcpyAsync(input_.data, input.data(), input.size(), cudaMemcpyHostToDevice, stream_), "copy in");
    context_->setTensorAddress(kInput, input_.data);
    context_->setTensorAddress(kOutput, output_.data);
    if (!context_->enqueueV3(stream_)) {
      throw Failure(TRTMC_ERROR_INFERENCE, "TensorRT inference failed (" + logger().take() + ")");
    }
    check_cuda(cudaMemcpyAsync(output.data(), output_.data, output.size(), cudaMemcpyDeviceToHost, stream_), "copy out");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return from_device_type(output, out_type);
  }

 private:
  std::unique_ptr<nvinfer1::IRuntime> runtime_;
  std::unique_ptr<nvinfer1::ICudaEngine> engine_;
  std::unique_ptr<nvinfer1::IExecutionContext> context_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer input_, output_;
};

bool runs_on(int major, int minor, const std::vector<std::string>& targets) {
  for (const std::string& target : targets) {
    if (target == std::to_string(major) + "." + std::to_string(minor) || target == std::to_string(major) + ".x") return true;
  }
  return false;
}

}  // namespace

std::optional<std::string> tensorrt_unavailable_reason(const EngineEntry& entry) {
  if (entry.builder != "tensorrt" && entry.builder != "tensorrt_rtx") {
    return "this TensorRT engine names an unknown builder '" + entry.builder + "'; rebuild it";
  }
  int count = 0;
  cudaDeviceProp gpu{};
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDeviceProperties(&gpu, 0) != cudaSuccess) {
    return std::string("TensorRT plans run only on a CUDA GPU and none is available here; use the inductor engine");
  }
  std::vector<std::string> targets = entry.compute_capabilities;
  if (targets.empty() && entry.builder == "tensorrt_rtx") targets = kRtxDefaultTargets;
  std::string capability = std::to_string(gpu.major) + "." + std::to_string(gpu.minor);
  if (!runs_on(gpu.major, gpu.minor, targets)) {
    return "this TensorRT plan (" + entry.builder + ") cannot run on compute capability " + capability + " (" +
           gpu.name + "); rebuild it on this GPU or use another engine";
  }
  if (entry.builder != TRTMC_TENSORRT_BUILDER) {
    return "this plan was built by " + entry.builder + " and this libtrtmc runs " + TRTMC_TENSORRT_BUILDER +
           " plans; rebuild the plan with " + TRTMC_TENSORRT_BUILDER + " or build the SDK against " + entry.builder;
  }
  if (release(entry.builder_version) != kVersion) {
    return "this plan was built by " + entry.builder + " " + entry.builder_version + " but libtrtmc runs " +
           TRTMC_TENSORRT_BUILDER + " " + kVersion + "; plans load only with the version that built them";
  }
  return std::nullopt;
}

std::unique_ptr<Engine> load_tensorrt(const Bundle& bundle, const EngineEntry& entry) {
  return std::make_unique<TensorRTEngine>(bundle.engine_file(entry, kPlan));
}

}  // namespace trtmc::internal
