// The SDK's contract, checked in C++ under ctest: binding, explicit and missing labels,
// normalization, owned output, rejection before inference, unsupported options, pinned digests.
//
//   sdk_contract_tests CONTRACT LABELLED.bundle UNLABELED.bundle
//
// LABELLED.bundle is a CPU bundle of examples/checkpoints/tf_efficientnet_lite0.in1k (ImageNet
// labels); UNLABELED.bundle is the same bundle with its labels removed. Each contract runs real
// inference through the C ABI; the tests also see the handles' internals (src/handles.h) to prove
// that rejected input never reaches the engine.
#include <openssl/evp.h>
#include <zip.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "handles.h"
#include "preprocess.h"
#include "trtmc.hpp"

namespace {

struct CheckFailed {
  std::string what;
};

#define CHECK(condition)                                                                              \
  do {                                                                                                \
    if (!(condition)) throw CheckFailed{std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #condition}; \
  } while (0)

struct Bundles {
  std::string labelled;
  std::string unlabeled;
};

// A deterministic image in [0, 1] that is not symmetric in any axis or channel.
std::vector<float> test_image(int64_t height, int64_t width) {
  std::vector<float> pixels(static_cast<size_t>(height * width * 3));
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      for (int64_t c = 0; c < 3; ++c)
        pixels[(y * width + x) * 3 + c] = static_cast<float>(0.5 + 0.5 * std::sin(0.05 * x + 0.11 * y + 2.0 * c));
  return pixels;
}

trtmc_model* open(const std::string& path) {
  trtmc_model* model = nullptr;
  trtmc_status* status = trtmc_model_open(path.c_str(), nullptr, 0, &model);
  if (status) std::cerr << trtmc_status_message(status) << "\n";
  CHECK(status == nullptr && model != nullptr);
  return model;
}

trtmc_scores* classify(trtmc_model* model, const std::vector<float>& pixels, int64_t height, int64_t width) {
  trtmc_scores* scores = nullptr;
  trtmc_status* status = trtmc_classify(model, pixels.data(), pixels.size(), height, width, &scores);
  if (status) std::cerr << trtmc_status_message(status) << "\n";
  CHECK(status == nullptr && scores != nullptr);
  return scores;
}

std::vector<float> logits_of(const trtmc_scores* scores) {
  return std::vector<float>(trtmc_scores_logits(scores), trtmc_scores_logits(scores) + trtmc_scores_count(scores));
}

// Expect `status` to carry `code` and a message containing `phrase`; releases it.
void expect_status(trtmc_status* status, trtmc_code code, const std::string& phrase) {
  CHECK(status != nullptr);
  std::string message = trtmc_status_message(status);
  trtmc_code got = trtmc_status_code(status);
  trtmc_status_release(status);
  if (got != code || message.find(phrase) == std::string::npos) {
    std::cerr << "expected " << trtmc_code_name(code) << " with '" << phrase << "', got " << trtmc_code_name(got)
              << ": " << message << "\n";
  }
  CHECK(got == code);
  CHECK(message.find(phrase) != std::string::npos);
}

// Expect `call` to throw trtmc::Error carrying `code` and a message containing `phrase`.
template <class Call>
void expect_error(Call&& call, trtmc_code code, const std::string& phrase) {
  try {
    call();
  } catch (const trtmc::Error& error) {
    CHECK(error.code() == code && std::string(error.code_name()) == trtmc_code_name(code));
    CHECK(std::string(error.what()).find(phrase) != std::string::npos);
    return;
  }
  CHECK(!"trtmc::Error thrown");
}

// The bundle's digest as `trtmc inspect` defines it, computed here from the zip: sha256 of
// manifest.json as stored, lower-case hex.
std::string manifest_sha256(const std::string& bundle) {
  zip_t* archive = zip_open(bundle.c_str(), ZIP_RDONLY, nullptr);
  CHECK(archive != nullptr);
  zip_stat_t stat;
  CHECK(zip_stat(archive, "manifest.json", 0, &stat) == 0);
  std::string manifest(stat.size, '\0');
  zip_file_t* file = zip_fopen(archive, "manifest.json", 0);
  CHECK(file != nullptr && zip_fread(file, manifest.data(), manifest.size()) == static_cast<zip_int64_t>(stat.size));
  zip_fclose(file);
  zip_discard(archive);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned length = 0;
  CHECK(EVP_Digest(manifest.data(), manifest.size(), digest, &length, EVP_sha256(), nullptr) && length == 32);
  std::string hex;
  char byte[3];
  for (unsigned i = 0; i < length; ++i) hex += (std::snprintf(byte, sizeof byte, "%02x", digest[i]), byte);
  return hex;
}

std::string upper(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::toupper(c); });
  return text;
}

trtmc_status* open_pinned(const std::string& path, const std::string& expect_sha256, trtmc_model** model) {
  trtmc_option option{"expect_sha256", expect_sha256.c_str()};
  return trtmc_model_open(path.c_str(), &option, 1, model);
}

trtmc::internal::PreprocessSpec spec(std::array<float, 3> mean, std::array<float, 3> std) {
  trtmc::internal::PreprocessSpec spec;
  spec.height = spec.width = 224;
  spec.interpolation = "bicubic";
  spec.crop_pct = 0.875;
  spec.crop_mode = "center";
  spec.mean = mean;
  spec.std = std;
  return spec;
}

void normalization_applies_the_bundles_mean_and_std_after_the_center_crop(const Bundles&) {
  // A constant color stays constant through the resize; normalization is per channel.
  auto imagenet = spec({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f});
  std::vector<float> flat(300 * 400 * 3);
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = (i % 3 == 0) ? 0.1f : (i % 3 == 1) ? 0.5f : 0.9f;
  std::vector<float> chw = trtmc::internal::preprocess(imagenet, flat.data(), 300, 400);
  CHECK(chw.size() == 3u * 224 * 224);
  const float colors[3] = {0.1f, 0.5f, 0.9f};
  for (int c = 0; c < 3; ++c) {
    float expected = (colors[c] - imagenet.mean[c]) / imagenet.std[c];
    for (int i = 0; i < 224 * 224; ++i) CHECK(std::fabs(chw[c * 224 * 224 + i] - expected) < 1e-5f);
  }
  // 256 rows are already the resize target (floor(224 / 0.875)), so the image is only cropped:
  // columns 144..367 of a horizontal ramp, rows 16..239 of a vertical one, laid out CHW.
  auto half = spec({0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f});
  std::vector<float> ramp(256 * 512 * 3);
  for (int y = 0; y < 256; ++y)
    for (int x = 0; x < 512; ++x) {
      ramp[(y * 512 + x) * 3 + 0] = x / 511.0f;
      ramp[(y * 512 + x) * 3 + 1] = y / 255.0f;
      ramp[(y * 512 + x) * 3 + 2] = 1.0f;
    }
  chw = trtmc::internal::preprocess(half, ramp.data(), 256, 512);
  for (int y = 0; y < 224; y += 37)
    for (int x = 0; x < 224; x += 31) {
      CHECK(chw[0 * 224 * 224 + y * 224 + x] == ((144 + x) / 511.0f - 0.5f) / 0.5f);
      CHECK(chw[1 * 224 * 224 + y * 224 + x] == ((16 + y) / 255.0f - 0.5f) / 0.5f);
      CHECK(chw[2 * 224 * 224 + y * 224 + x] == 1.0f);
    }
}

void options_other_than_expect_sha256_are_refused_because_the_task_has_none(const Bundles& bundles) {
  for (const char* name : {"precision", "interpolation", "mean", "engine", "EXPECT_SHA256", "expect-sha256"}) {
    trtmc_option option{name, "x"};
    trtmc_model* model = reinterpret_cast<trtmc_model*>(&option);  // must be reset to NULL
    expect_status(trtmc_model_open(bundles.labelled.c_str(), &option, 1, &model), TRTMC_ERROR_UNSUPPORTED_OPTION,
                  std::string("unsupported option '") + name + "': the only option is expect_sha256");
    CHECK(model == nullptr);
  }
  // A valid pin does not let another option through, and the refusal names only the other one.
  std::string digest = manifest_sha256(bundles.labelled);
  trtmc_option mixed[] = {{"expect_sha256", digest.c_str()}, {"precision", "fp16"}};
  trtmc_model* model = nullptr;
  expect_status(trtmc_model_open(bundles.labelled.c_str(), mixed, 2, &model), TRTMC_ERROR_UNSUPPORTED_OPTION,
                "unsupported option 'precision': the only option is expect_sha256 (the bundle's digest); "
                "image_to_class_scores takes no runtime options");
  CHECK(model == nullptr);
  trtmc_option unnamed{nullptr, "x"};
  expect_status(trtmc_model_open(bundles.labelled.c_str(), &unnamed, 1, &model), TRTMC_ERROR_UNSUPPORTED_OPTION,
                "'(null)'");
  expect_status(trtmc_model_open(bundles.labelled.c_str(), nullptr, 1, &model), TRTMC_ERROR_NULL_ARGUMENT, "options");
  expect_error([&] { trtmc::ImageToClassScores(bundles.labelled, {{"precision", "fp16"}}); },
               TRTMC_ERROR_UNSUPPORTED_OPTION, "preprocessing and precision are fixed by the bundle");
}

void a_pinned_digest_opens_its_bundle_and_refuses_any_other(const Bundles& bundles) {
  std::string digest = manifest_sha256(bundles.labelled);
  std::string other = manifest_sha256(bundles.unlabeled);  // same engine, other labels: another bundle
  CHECK(digest != other);
  // The digest as `trtmc inspect` prints it, and as a user pastes it (either case, stray whitespace).
  for (const std::string& typed : {digest, " \t" + upper(digest) + "\n", "\u00a0" + digest + "\u3000"}) {
    trtmc_model* model = nullptr;
    trtmc_status* status = open_pinned(bundles.labelled, typed, &model);
    if (status) std::cerr << trtmc_status_message(status) << "\n";
    CHECK(status == nullptr && model != nullptr);
    CHECK(trtmc_model_digest(model) == digest);
    std::vector<float> pixels = test_image(40, 60);
    trtmc_scores_release(classify(model, pixels, 40, 60));
    CHECK(model->engine_calls == 1);
    trtmc_model_release(model);
  }
  trtmc_model* unpinned = open(bundles.unlabeled);
  CHECK(trtmc_model_digest(unpinned) == other && trtmc_model_digest(nullptr) == nullptr);
  trtmc_model_release(unpinned);
  // Python's wording (trtmc.bundle.read_bundle), with TRTMC_ERROR_DIGEST_MISMATCH; no model, no engine call.
  trtmc_model* model = reinterpret_cast<trtmc_model*>(&digest);  // must be reset to NULL
  expect_status(open_pinned(bundles.unlabeled, upper(digest), &model), TRTMC_ERROR_DIGEST_MISMATCH,
                bundles.unlabeled + ": manifest digest " + other + " is not the expected " + digest +
                    ": this is not the bundle you pinned, so nothing in it was loaded; check where it came from, "
                    "or pin the digest `trtmc inspect` prints for it");
  CHECK(model == nullptr);
  CHECK(std::string(trtmc_code_name(TRTMC_ERROR_DIGEST_MISMATCH)) == "TRTMC_ERROR_DIGEST_MISMATCH");
  // The C++ wrapper: a constructor parameter and an accessor over the same calls.
  trtmc::ImageToClassScores pinned(bundles.labelled, upper(digest));
  CHECK(pinned.digest() == digest && trtmc::ImageToClassScores(bundles.unlabeled).digest() == other);
  expect_error([&] { trtmc::ImageToClassScores(bundles.unlabeled, digest); }, TRTMC_ERROR_DIGEST_MISMATCH,
               "is not the bundle you pinned");
}

void a_malformed_digest_is_an_invalid_argument_refused_before_the_bundle_is_read(const Bundles& bundles) {
  std::string digest = manifest_sha256(bundles.labelled);
  std::string missing = bundles.labelled + ".missing";  // the digest is checked first, as in Python
  for (const std::string& typed : {std::string("abc"), std::string(""), digest.substr(1), digest + "0",
                                   digest.substr(0, 63) + "g", digest.substr(0, 32) + " " + digest.substr(32),
                                   "0x" + digest.substr(2), "sha256:" + digest}) {
    trtmc_model* model = nullptr;
    expect_status(open_pinned(missing, typed, &model), TRTMC_ERROR_INVALID_ARGUMENT,
                  "trtmc_model_open: option expect_sha256 takes the 64 hex digits `trtmc inspect` prints as the "
                  "digest, got '" + typed + "'");
    CHECK(model == nullptr);
  }
  trtmc_model* model = nullptr;
  trtmc_option twice[] = {{"expect_sha256", digest.c_str()}, {"expect_sha256", digest.c_str()}};
  expect_status(trtmc_model_open(bundles.labelled.c_str(), twice, 2, &model), TRTMC_ERROR_INVALID_ARGUMENT,
                "option expect_sha256 is given twice");
  trtmc_option no_value{"expect_sha256", nullptr};
  expect_status(trtmc_model_open(bundles.labelled.c_str(), &no_value, 1, &model), TRTMC_ERROR_NULL_ARGUMENT,
                "the value of option expect_sha256 is NULL");
  CHECK(model == nullptr);
  // An empty pin is not "no pin": it is refused too.
  expect_error([&] { trtmc::ImageToClassScores(bundles.labelled, std::string()); }, TRTMC_ERROR_INVALID_ARGUMENT,
               "takes the 64 hex digits");
}

void a_bundle_binds_image_to_class_scores_to_its_engine(const Bundles& bundles) {
  CHECK(TRTMC_ABI_COMPATIBLE(trtmc_abi_version()));
  trtmc_model* model = open(bundles.labelled);
  CHECK(std::string(trtmc_model_engine(model)) == "inductor-cpu-fp32");
  CHECK(trtmc_model_skipped_count(model) == 0 && trtmc_model_skipped(model, 0) == nullptr);
  std::vector<float> pixels = test_image(120, 90);
  trtmc_scores* scores = classify(model, pixels, 120, 90);
  CHECK(std::string(trtmc_scores_engine(scores)) == "inductor-cpu-fp32");
  CHECK(trtmc_scores_count(scores) == 1000);
  for (float logit : logits_of(scores)) CHECK(std::isfinite(logit));
  // The same image gives the same logits; another image gives others.
  trtmc_scores* again = classify(model, pixels, 120, 90);
  CHECK(logits_of(again) == logits_of(scores));
  std::vector<float> other = test_image(90, 120);
  trtmc_scores* different = classify(model, other, 90, 120);
  CHECK(logits_of(different) != logits_of(scores));
  trtmc_scores_release(different);
  trtmc_scores_release(again);
  trtmc_scores_release(scores);
  trtmc_model_release(model);
  expect_status(trtmc_model_open((bundles.labelled + ".missing").c_str(), nullptr, 0, &model), TRTMC_ERROR_BUNDLE,
                "no such bundle file");
}

void explicit_labels_come_back_with_their_vocabulary(const Bundles& bundles) {
  trtmc_model* model = open(bundles.labelled);
  std::vector<float> pixels = test_image(64, 64);
  trtmc_scores* scores = classify(model, pixels, 64, 64);
  CHECK(trtmc_scores_label_count(scores) == trtmc_scores_count(scores));
  CHECK(std::string(trtmc_scores_label_name(scores, 282)) == "n02123159");  // tiger cat
  CHECK(trtmc_scores_label_name(scores, 1000) == nullptr);
  CHECK(std::string(trtmc_scores_vocabulary_id(scores)) == "imagenet-1k");
  trtmc_scores_release(scores);
  trtmc_model_release(model);
}

void missing_labels_leave_names_and_vocabulary_empty(const Bundles& bundles) {
  std::vector<float> pixels = test_image(64, 80);
  trtmc_model* labelled = open(bundles.labelled);
  trtmc_model* unlabeled = open(bundles.unlabeled);
  trtmc_scores* with = classify(labelled, pixels, 64, 80);
  trtmc_scores* without = classify(unlabeled, pixels, 64, 80);
  CHECK(trtmc_scores_label_count(without) == 0 && trtmc_scores_label_name(without, 0) == nullptr);
  CHECK(std::string(trtmc_scores_vocabulary_id(without)).empty());
  CHECK(logits_of(without) == logits_of(with));  // indices stay model-local, the logits are the same
  trtmc_scores_release(with);
  trtmc_scores_release(without);
  trtmc_model_release(labelled);
  trtmc_model_release(unlabeled);
}

void invalid_input_is_rejected_before_inference(const Bundles& bundles) {
  trtmc_model* model = open(bundles.labelled);
  std::vector<float> good = test_image(32, 48);
  auto reject = [&](const float* pixels, size_t count, int64_t height, int64_t width, trtmc_code code,
                    const std::string& phrase) {
    trtmc_scores* scores = reinterpret_cast<trtmc_scores*>(&good);  // must be reset to NULL
    expect_status(trtmc_classify(model, pixels, count, height, width, &scores), code, phrase);
    CHECK(scores == nullptr);
    CHECK(model->engine_calls == 0);
  };
  reject(nullptr, good.size(), 32, 48, TRTMC_ERROR_NULL_ARGUMENT, "pixels is NULL");
  reject(good.data(), good.size(), 0, 48, TRTMC_ERROR_INVALID_SIZE, "must be positive");
  reject(good.data(), good.size(), 32, -48, TRTMC_ERROR_INVALID_SIZE, "must be positive");
  reject(good.data(), good.size(), INT64_MAX, INT64_MAX, TRTMC_ERROR_INVALID_SIZE, "too large");
  reject(good.data(), good.size() - 1, 32, 48, TRTMC_ERROR_SIZE_MISMATCH, "needs 4608");
  reject(good.data(), good.size(), 48, 48, TRTMC_ERROR_SIZE_MISMATCH, "holds 4608 floats");
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> pixels = good;
    pixels[3 * 48 + 5] = bad;  // row 1, column 1, channel 2
    reject(pixels.data(), pixels.size(), 32, 48, TRTMC_ERROR_NON_FINITE, "row 1, column 1, channel 2");
  }
  for (float bad : {-0.001f, 1.5f, 255.0f}) {
    std::vector<float> pixels = good;
    pixels.back() = bad;
    reject(pixels.data(), pixels.size(), 32, 48, TRTMC_ERROR_OUT_OF_RANGE, "values must lie in [0, 1]");
  }
  std::vector<float> both = good;  // NaN wins over a range error, as in the Python task
  both[0] = 2.0f;
  both[1] = NAN;
  reject(both.data(), both.size(), 32, 48, TRTMC_ERROR_NON_FINITE, "nan");
  trtmc_scores* scores = nullptr;
  expect_status(trtmc_classify(nullptr, good.data(), good.size(), 32, 48, &scores), TRTMC_ERROR_NULL_ARGUMENT, "model");
  expect_status(trtmc_classify(model, good.data(), good.size(), 32, 48, nullptr), TRTMC_ERROR_NULL_ARGUMENT, "scores");
  expect_status(trtmc_model_open(nullptr, nullptr, 0, &model), TRTMC_ERROR_NULL_ARGUMENT, "bundle_path");
  CHECK(model == nullptr);
  model = open(bundles.labelled);
  expect_status(trtmc_model_open(bundles.labelled.c_str(), nullptr, 0, nullptr), TRTMC_ERROR_NULL_ARGUMENT, "model");
  CHECK(model->engine_calls == 0);
  trtmc_scores_release(classify(model, good, 32, 48));  // and a valid image does reach the engine
  CHECK(model->engine_calls == 1);
  trtmc_model_release(model);
}

void scores_are_owned_and_outlive_their_model(const Bundles& bundles) {
  trtmc_model* model = open(bundles.labelled);
  std::vector<float> pixels = test_image(100, 100);
  trtmc_scores* first = classify(model, pixels, 100, 100);
  std::vector<float> expected = logits_of(first);
  const float* storage = trtmc_scores_logits(first);
  pixels.assign(pixels.size(), 0.25f);  // the result does not alias the input ...
  trtmc_scores* second = classify(model, pixels, 100, 100);
  CHECK(trtmc_scores_logits(second) != storage);  // ... nor another result
  trtmc_model_release(model);
  CHECK(logits_of(first) == expected && trtmc_scores_logits(first) == storage);
  CHECK(logits_of(second) != expected);
  CHECK(std::string(trtmc_scores_label_name(first, 282)) == "n02123159");
  CHECK(std::string(trtmc_scores_vocabulary_id(second)) == "imagenet-1k");
  CHECK(std::string(trtmc_scores_engine(first)) == "inductor-cpu-fp32");
  trtmc_scores_release(second);
  trtmc_scores_release(first);
  trtmc_model_release(nullptr);  // releasing NULL is allowed
  trtmc_scores_release(nullptr);
  trtmc_status_release(nullptr);
}

void the_cpp_wrapper_returns_what_the_c_abi_returns(const Bundles& bundles) {
  std::vector<float> pixels = test_image(50, 70);
  trtmc_model* model = open(bundles.labelled);
  trtmc_scores* c_scores = classify(model, pixels, 50, 70);
  std::optional<trtmc::Scores> scores;
  {
    trtmc::ImageToClassScores wrapper(bundles.labelled);
    CHECK(wrapper.engine() == trtmc_model_engine(model) && wrapper.skipped_engines().empty());
    scores.emplace(wrapper(pixels.data(), pixels.size(), 50, 70));
    expect_error([&] { wrapper(pixels.data(), pixels.size(), 70, 50 + 1); }, TRTMC_ERROR_SIZE_MISMATCH, "needs");
  }
  CHECK(scores->logits() == logits_of(c_scores));
  CHECK(scores->label_names().size() == trtmc_scores_label_count(c_scores));
  CHECK(scores->label_names()[0] == trtmc_scores_label_name(c_scores, 0));
  CHECK(scores->vocabulary_id() == "imagenet-1k" && scores->engine() == "inductor-cpu-fp32");
  trtmc_scores_release(c_scores);
  trtmc_model_release(model);
}

const std::map<std::string, std::function<void(const Bundles&)>> kContracts = {
    {"normalization_applies_the_bundles_mean_and_std_after_the_center_crop",
     normalization_applies_the_bundles_mean_and_std_after_the_center_crop},
    {"options_other_than_expect_sha256_are_refused_because_the_task_has_none",
     options_other_than_expect_sha256_are_refused_because_the_task_has_none},
    {"a_pinned_digest_opens_its_bundle_and_refuses_any_other",
     a_pinned_digest_opens_its_bundle_and_refuses_any_other},
    {"a_malformed_digest_is_an_invalid_argument_refused_before_the_bundle_is_read",
     a_malformed_digest_is_an_invalid_argument_refused_before_the_bundle_is_read},
    {"a_bundle_binds_image_to_class_scores_to_its_engine", a_bundle_binds_image_to_class_scores_to_its_engine},
    {"explicit_labels_come_back_with_their_vocabulary", explicit_labels_come_back_with_their_vocabulary},
    {"missing_labels_leave_names_and_vocabulary_empty", missing_labels_leave_names_and_vocabulary_empty},
    {"invalid_input_is_rejected_before_inference", invalid_input_is_rejected_before_inference},
    {"scores_are_owned_and_outlive_their_model", scores_are_owned_and_outlive_their_model},
    {"the_cpp_wrapper_returns_what_the_c_abi_returns", the_cpp_wrapper_returns_what_the_c_abi_returns},
};

}  // namespace

int main(int argc, char** argv) {
  auto contract = argc == 4 ? kContracts.find(argv[1]) : kContracts.end();
  if (contract == kContracts.end()) {
    std::cerr << "usage: " << argv[0] << " CONTRACT LABELLED.bundle UNLABELED.bundle; contracts:\n";
    for (const auto& [name, run] : kContracts) std::cerr << "  " << name << "\n";
    return 2;
  }
  try {
    contract->second(Bundles{argv[2], argv[3]});
  } catch (const CheckFailed& failure) {
    std::cerr << contract->first << ": FAILED " << failure.what << "\n";
    return 1;
  }
  std::cout << contract->first << ": passed\n";
  return 0;
}
