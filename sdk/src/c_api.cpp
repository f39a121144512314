// The C ABI (trtmc.h): argument checks, status objects and handles. Every exported function
// catches everything, so no exception crosses the C boundary.
#include <cmath>
#include <limits>
#include <new>
#include <optional>
#include <sstream>
#include <string_view>

#include "failure.h"
#include "handles.h"
#include "preprocess.h"

using trtmc::internal::Failure;

namespace {

// Returned when even a status cannot be allocated; releasing it does nothing.
trtmc_status out_of_memory_status{TRTMC_ERROR_OUT_OF_MEMORY, "libtrtmc: out of memory"};

trtmc_status* make_status(trtmc_code code, const std::string& message) noexcept {
  try {
    return new trtmc_status{code, message};
  } catch (...) {
    return &out_of_memory_status;
  }
}

template <class Body>
trtmc_status* guarded(const char* function, Body&& body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const Failure& failure) {
    return make_status(failure.code(), failure.what());
  } catch (const std::bad_alloc&) {
    return &out_of_memory_status;
  } catch (const std::exception& error) {
    return make_status(TRTMC_ERROR_INTERNAL, std::string(function) + ": " + error.what());
  } catch (...) {
    return make_status(TRTMC_ERROR_INTERNAL, std::string(function) + ": unknown error");
  }
}

void require(const void* pointer, const char* function, const char* argument) {
  if (pointer == nullptr) {
    throw Failure(TRTMC_ERROR_NULL_ARGUMENT, std::string(function) + ": " + argument + " is NULL");
  }
}

constexpr std::string_view kExpectSha256 = "expect_sha256";

// What trtmc_model_open's options ask for.
struct OpenOptions {
  std::optional<std::string> expect_sha256;  // lower-case hex: the digest the bundle must have
};

// Refuses every option but expect_sha256 (the task has none: the bundle fixes preprocessing and
// precision), then checks expect_sha256's value; all before the bundle is opened.
OpenOptions parse_options(const trtmc_option* options, size_t option_count) {
  OpenOptions parsed;
  if (option_count == 0) return parsed;
  require(options, "trtmc_model_open", "options (with option_count > 0)");
  std::string unsupported;
  for (size_t i = 0; i < option_count; ++i) {
    if (options[i].name != nullptr && options[i].name == kExpectSha256) continue;
    unsupported += std::string(unsupported.empty() ? "" : ", ") + "'" + (options[i].name ? options[i].name : "(null)") + "'";
  }
  if (!unsupported.empty()) {
    throw Failure(TRTMC_ERROR_UNSUPPORTED_OPTION,
                  "trtmc_model_open: unsupported option " + unsupported +
                      ": the only option is expect_sha256 (the bundle's digest); image_to_class_scores takes no "
                      "runtime options: preprocessing and precision are fixed by the bundle (rebuild it with "
                      "`trtmc build` to change them)");
  }
  for (size_t i = 0; i < option_count; ++i) {
    if (parsed.expect_sha256) {
      throw Failure(TRTMC_ERROR_INVALID_ARGUMENT, "trtmc_model_open: option expect_sha256 is given twice; pass it once");
    }
    require(options[i].value, "trtmc_model_open", "the value of option expect_sha256");
    parsed.expect_sha256 = trtmc::internal::normalized_digest(options[i].value);
    if (!parsed.expect_sha256) {
      throw Failure(TRTMC_ERROR_INVALID_ARGUMENT, std::string("trtmc_model_open: option expect_sha256 takes the 64 hex "
                                                              "digits `trtmc inspect` prints as the digest, got '") +
                                                      options[i].value + "'");
    }
  }
  return parsed;
}

std::string where(size_t index, int64_t width) {
  auto pixel = static_cast<int64_t>(index / 3);
  return "row " + std::to_string(pixel / width) + ", column " + std::to_string(pixel % width) + ", channel " +
         std::to_string(index % 3);
}

std::string format(float value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// Everything the task refuses, checked before any preprocessing or inference.
void check_image(const float* pixels, size_t element_count, int64_t height, int64_t width) {
  if (height <= 0 || width <= 0) {
    throw Failure(TRTMC_ERROR_INVALID_SIZE, "trtmc_classify: height and width must be positive, got height " +
                                                std::to_string(height) + " and width " + std::to_string(width));
  }
  constexpr auto limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / 3);
  if (static_cast<uint64_t>(height) > limit / static_cast<uint64_t>(width)) {
    throw Failure(TRTMC_ERROR_INVALID_SIZE, "trtmc_classify: height " + std::to_string(height) + " x width " +
                                                std::to_string(width) + " is too large");
  }
  const auto needed = static_cast<uint64_t>(height) * static_cast<uint64_t>(width) * 3;
  if (element_count != needed) {
    throw Failure(TRTMC_ERROR_SIZE_MISMATCH,
                  "trtmc_classify: the buffer holds " + std::to_string(element_count) + " floats but height " +
                      std::to_string(height) + " x width " + std::to_string(width) + " x 3 channels needs " +
                      std::to_string(needed) + " (contiguous RGB float32, HWC)");
  }
  size_t first_out_of_range = element_count;
  for (size_t i = 0; i < element_count; ++i) {
    float value = pixels[i];
    if (!std::isfinite(value)) {
      throw Failure(TRTMC_ERROR_NON_FINITE, "trtmc_classify: the image contains " + format(value) + " at " +
                                                where(i, width) + "; pixels must be finite RGB values in [0, 1]");
    }
    if ((value < 0.0f || value > 1.0f) && first_out_of_range == element_count) first_out_of_range = i;
  }
  if (first_out_of_range != element_count) {
    throw Failure(TRTMC_ERROR_OUT_OF_RANGE, "trtmc_classify: values must lie in [0, 1], found " +
                                                format(pixels[first_out_of_range]) + " at " +
                                                where(first_out_of_range, width) + "; divide 8-bit pixels by 255");
  }
}

}  // namespace

extern "C" {

uint32_t trtmc_abi_version(void) { return TRTMC_ABI_VERSION; }

const char* trtmc_code_name(trtmc_code code) {
  switch (code) {
    case TRTMC_OK: return "TRTMC_OK";
    case TRTMC_ERROR_NULL_ARGUMENT: return "TRTMC_ERROR_NULL_ARGUMENT";
    case TRTMC_ERROR_INVALID_SIZE: return "TRTMC_ERROR_INVALID_SIZE";
    case TRTMC_ERROR_SIZE_MISMATCH: return "TRTMC_ERROR_SIZE_MISMATCH";
    case TRTMC_ERROR_NON_FINITE: return "TRTMC_ERROR_NON_FINITE";
    case TRTMC_ERROR_OUT_OF_RANGE: return "TRTMC_ERROR_OUT_OF_RANGE";
    case TRTMC_ERROR_UNSUPPORTED_OPTION: return "TRTMC_ERROR_UNSUPPORTED_OPTION";
    case TRTMC_ERROR_BUNDLE: return "TRTMC_ERROR_BUNDLE";
    case TRTMC_ERROR_NO_ENGINE: return "TRTMC_ERROR_NO_ENGINE";
    case TRTMC_ERROR_INFERENCE: return "TRTMC_ERROR_INFERENCE";
    case TRTMC_ERROR_OUT_OF_MEMORY: return "TRTMC_ERROR_OUT_OF_MEMORY";
    case TRTMC_ERROR_INTERNAL: return "TRTMC_ERROR_INTERNAL";
    case TRTMC_ERROR_DIGEST_MISMATCH: return "TRTMC_ERROR_DIGEST_MISMATCH";
    case TRTMC_ERROR_INVALID_ARGUMENT: return "TRTMC_ERROR_INVALID_ARGUMENT";
  }
  return "TRTMC_ERROR_UNKNOWN";
}

trtmc_code trtmc_status_code(const trtmc_status* status) { return status ? status->code : TRTMC_OK; }

const char* trtmc_status_message(const trtmc_status* status) { return status ? status->message.c_str() : ""; }

void trtmc_status_release(trtmc_status* status) {
  if (status != &out_of_memory_status) delete status;
}

trtmc_status* trtmc_model_open(const char* bundle_path, const trtmc_option* options, size_t option_count,
                               trtmc_model** model) {
  if (model != nullptr) *model = nullptr;
  return guarded("trtmc_model_open", [&] {
    require(model, "trtmc_model_open", "model (the output handle)");
    require(bundle_path, "trtmc_model_open", "bundle_path");
    OpenOptions open_options = parse_options(options, option_count);
    trtmc::internal::Bundle bundle = trtmc::internal::read_bundle(bundle_path, open_options.expect_sha256);
    if (bundle.task != trtmc::internal::kTask) {
      throw Failure(TRTMC_ERROR_BUNDLE, bundle.path + ": this bundle serves task '" + bundle.task + "', not " +
                                            trtmc::internal::kTask + "; rebuild it with `trtmc build`");
    }
    auto opened = std::make_unique<trtmc_model>();
    opened->preprocess = bundle.preprocess;
    opened->labels = bundle.labels;
    opened->digest = bundle.digest;
    opened->chosen = trtmc::internal::load_first_engine(bundle);
    *model = opened.release();
  });
}

void trtmc_model_release(trtmc_model* model) { delete model; }

const char* trtmc_model_engine(const trtmc_model* model) { return model ? model->chosen.key.c_str() : nullptr; }

const char* trtmc_model_digest(const trtmc_model* model) { return model ? model->digest.c_str() : nullptr; }

size_t trtmc_model_skipped_count(const trtmc_model* model) { return model ? model->chosen.skipped.size() : 0; }

const char* trtmc_model_skipped(const trtmc_model* model, size_t index) {
  if (model == nullptr || index >= model->chosen.skipped.size()) return nullptr;
  return model->chosen.skipped[index].c_str();
}

trtmc_status* trtmc_classify(trtmc_model* model, const float* pixels, size_t element_count, int64_t height,
                             int64_t width, trtmc_scores** scores) {
  if (scores != nullptr) *scores = nullptr;
  return guarded("trtmc_classify", [&] {
    require(model, "trtmc_classify", "model");
    require(pixels, "trtmc_classify", "pixels");
    require(scores, "trtmc_classify", "scores (the output handle)");
    check_image(pixels, element_count, height, width);
    const trtmc::internal::PreprocessSpec& spec = model->preprocess;
    std::vector<float> input = trtmc::internal::preprocess(spec, pixels, height, width);
    auto result = std::make_unique<trtmc_scores>();
    {
      std::lock_guard<std::mutex> lock(model->run_lock);
      ++model->engine_calls;
      result->logits = model->chosen.engine->run(input, {1, 3, spec.height, spec.width});
    }
    result->labels = model->labels;
    result->engine = model->chosen.key;
    *scores = result.release();
  });
}

void trtmc_scores_release(trtmc_scores* scores) { delete scores; }

size_t trtmc_scores_count(const trtmc_scores* scores) { return scores ? scores->logits.size() : 0; }

const float* trtmc_scores_logits(const trtmc_scores* scores) { return scores ? scores->logits.data() : nullptr; }

size_t trtmc_scores_label_count(const trtmc_scores* scores) { return scores ? scores->labels->names.size() : 0; }

const char* trtmc_scores_label_name(const trtmc_scores* scores, size_t index) {
  if (scores == nullptr || index >= scores->labels->names.size()) return nullptr;
  return scores->labels->names[index].c_str();
}

const char* trtmc_scores_vocabulary_id(const trtmc_scores* scores) {
  return scores ? scores->labels->vocabulary_id.c_str() : nullptr;
}

const char* trtmc_scores_engine(const trtmc_scores* scores) { return scores ? scores->engine.c_str() : nullptr; }

}  // extern "C"
