// Reading a trtmc bundle (format version 1, see src/trtmc/bundle.py): a stored zip whose
// manifest.json lists every other member with its size and sha256. read_bundle refuses what the
// Python reader refuses, with the same advice: a missing or truncated file, an unknown format
// version, a member that is missing or fails its checksum, a member the manifest does not list.
// Its digest (the sha256 of manifest.json as stored, which pins every other member's sha256) is
// Python's `manifest_digest`; a pinned digest is checked before anything else in the bundle is read.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trtmc::internal {

inline constexpr int kFormatVersion = 2;
inline constexpr const char* kTask = "image_to_class_scores";

// runtime.json: timm's eval transform (trtmc.preprocess.PreprocessSpec).
struct PreprocessSpec {
  int64_t height = 0;  // input size
  int64_t width = 0;
  std::string interpolation;  // bicubic, bilinear or nearest
  double crop_pct = 1.0;
  std::string crop_mode;  // squash resizes both sides; anything else keeps the aspect ratio
  std::array<float, 3> mean{};
  std::array<float, 3> std{};
};

// labels.json: one name per class, or none (indices are then model-local).
struct Labels {
  std::vector<std::string> names;
  std::string vocabulary_id;  // e.g. "imagenet-1k"; empty when unknown
};

// One entry of the manifest's "engines", with the parts of its record that decide where it runs.
struct EngineEntry {
  std::string key;  // backend-device-precision
  std::string backend;
  std::string device;
  std::string precision;
  std::vector<std::string> files;
  std::string builder;          // record.builder: inductor, tensorrt or tensorrt_rtx
  std::string builder_version;  // record.builder_version
  std::string torch_version;    // record.versions.torch (inductor engines)
  std::string io_dtype;         // record.options.io_dtype: f32, f16 or bf16
  std::vector<std::string> compute_capabilities;  // record.compute_capabilities (TensorRT plans)

  bool has_file(const std::string& name) const;
};

struct Bundle {
  std::string path;
  std::string digest;  // sha256 (lower-case hex) of manifest.json as stored
  std::string task;
  PreprocessSpec preprocess;
  std::shared_ptr<const Labels> labels;
  std::vector<EngineEntry> engines;  // in the manifest's order
  // Verified bytes of every engine member ("engines/<key>/<file>"); the SDK needs neither the
  // graph nor its weights, since the engines carry their own.
  std::map<std::string, std::string> engine_members;

  const std::string& engine_file(const EngineEntry& engine, const std::string& name) const;
};

// The digest a user typed (the expect_sha256 option) in lower case, or nullopt when it is not 64 hex
// digits. Accepts what trtmc.bundle.expected_digest accepts: either case, and the whitespace
// Python's str.strip() removes around it.
std::optional<std::string> normalized_digest(std::string_view text);

// Open and verify a bundle; throws Failure(TRTMC_ERROR_BUNDLE) naming the problem and the fix.
// With `expect_sha256` (from normalized_digest), a bundle whose digest differs is refused with
// TRTMC_ERROR_DIGEST_MISMATCH as soon as its manifest is read: before its format version, its
// members or its engines are looked at.
Bundle read_bundle(const std::string& path, const std::optional<std::string>& expect_sha256 = std::nullopt);

}  // namespace trtmc::internal
