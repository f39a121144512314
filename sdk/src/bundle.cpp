// Reading a bundle with well-kept libraries: libzip for the archive (its consistency check refuses
// truncated files), OpenSSL for SHA-256 (the members' checksums and the manifest digest),
// nlohmann-json for the JSON members.
#include "bundle.h"

#include <openssl/evp.h>
#include <sys/stat.h>
#include <zip.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "failure.h"

namespace trtmc::internal {
namespace {

using nlohmann::json;

constexpr const char* kManifest = "manifest.json";
constexpr const char* kRebuild = "rebuild it with `trtmc build`";

[[noreturn]] void refuse(const std::string& path, const std::string& problem) {
  throw Failure(TRTMC_ERROR_BUNDLE, path + ": " + problem);
}

std::string hex(const unsigned char* bytes, unsigned length) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < length; ++i) {
    out += digits[bytes[i] >> 4];
    out += digits[bytes[i] & 15];
  }
  return out;
}

std::string sha256(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned length = 0;
  if (!EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr)) {
    throw Failure(TRTMC_ERROR_INTERNAL, "OpenSSL could not compute a SHA-256 digest");
  }
  return hex(digest, length);
}

struct ZipCloser {
  void operator()(zip_t* archive) const { zip_discard(archive); }
};
using Archive = std::unique_ptr<zip_t, ZipCloser>;

Archive open_archive(const std::string& path) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) refuse(path, "no such bundle file");
  int code = 0;
  zip_t* archive = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code);
  if (archive == nullptr) {
    zip_error_t error;
    zip_error_init_with_code(&error, code);
    std::string reason = zip_error_strerror(&error);
    zip_error_fini(&error);
    refuse(path, "truncated, corrupted or not a trtmc bundle (" + reason + "); " + kRebuild);
  }
  return Archive(archive);
}

std::string read_member(zip_t* archive, zip_uint64_t index, const std::string& path, const std::string& name) {
  zip_stat_t stat;
  zip_file_t* file = nullptr;
  if (zip_stat_index(archive, index, 0, &stat) != 0 || (file = zip_fopen_index(archive, index, 0)) == nullptr) {
    refuse(path, "damaged bundle (cannot read member " + name + ": " + zip_strerror(archive) + "); " + kRebuild);
  }
  std::string data(stat.size, '\0');
  zip_int64_t got = zip_fread(file, data.data(), data.size());
  std::string error = got < 0 ? zip_file_strerror(file) : "";
  zip_fclose(file);
  if (got < 0 || static_cast<zip_uint64_t>(got) != stat.size) {
    refuse(path, "damaged bundle (member " + name + " reads short" + (error.empty() ? "" : ": " + error) + "); " +
                     kRebuild);
  }
  return data;
}

std::map<std::string, zip_uint64_t> list_members(zip_t* archive, const std::string& path) {
  std::map<std::string, zip_uint64_t> names;
  zip_int64_t count = zip_get_num_entries(archive, 0);
  for (zip_int64_t i = 0; i < count; ++i) {
    const char* name = zip_get_name(archive, i, 0);
    if (name == nullptr || !names.emplace(name, i).second) {
      refuse(path, "damaged or tampered bundle (an unnamed or repeated member); " + std::string(kRebuild));
    }
  }
  return names;
}

json parse_json(const std::string& data, const std::string& path, const std::string& name) {
  try {
    return json::parse(data);
  } catch (const json::exception& error) {
    refuse(path, "damaged bundle (" + name + " is not JSON: " + error.what() + "); " + kRebuild);
  }
}

void check_version(const json& manifest, const std::string& path) {
  const json* version = manifest.is_object() && manifest.contains("format_version") ? &manifest["format_version"] : nullptr;
  if (version == nullptr || !version->is_number_integer() || version->get<int64_t>() != kFormatVersion) {
    refuse(path, "bundle format version " + (version ? version->dump() : std::string("None")) +
                     " is not supported by libtrtmc (it reads version " + std::to_string(kFormatVersion) + "); " +
                     kRebuild + " with the trtmc this SDK belongs to, or use the trtmc that wrote it");
  }
}

// The characters Python's str.isspace() accepts, UTF-8 encoded: str.strip() removes them around a
// typed digest, so the SDK does too.
constexpr std::string_view kPythonWhitespace[] = {
    "\t", "\n", "\v", "\f", "\r", "\x1c", "\x1d", "\x1e", "\x1f", " ", "\u0085", "\u00a0", "\u1680",
    "\u2000", "\u2001", "\u2002", "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009",
    "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"};

std::string_view strip_python_whitespace(std::string_view text) {
  for (bool stripped = true; stripped;) {
    stripped = false;
    for (std::string_view space : kPythonWhitespace) {
      if (text.starts_with(space)) text.remove_prefix(space.size()), stripped = true;
      if (text.ends_with(space)) text.remove_suffix(space.size()), stripped = true;
    }
  }
  return text;
}

void check_digest(const std::string& digest, const std::optional<std::string>& expected, const std::string& path) {
  if (expected && digest != *expected) {
    throw Failure(TRTMC_ERROR_DIGEST_MISMATCH,
                  path + ": manifest digest " + digest + " is not the expected " + *expected +
                      ": this is not the bundle you pinned, so nothing in it was loaded; check where it came from, "
                      "or pin the digest `trtmc inspect` prints for it");
  }
}

bool is_engine_member(const std::string& name) { return name.rfind("engines/", 0) == 0; }

// Every listed member must be present with its size and sha256; nothing unlisted may be present.
std::map<std::string, std::string> verified_members(zip_t* archive, const json& manifest, const std::string& path) {
  std::map<std::string, zip_uint64_t> present = list_members(archive, path);
  std::map<std::string, std::string> kept;
  const json& expected = manifest.at("members");
  for (const auto& [name, meta] : expected.items()) {
    auto found = present.find(name);
    if (found == present.end()) refuse(path, "member " + name + " is missing; the file is damaged, " + kRebuild);
    std::string data = read_member(archive, found->second, path, name);
    if (data.size() != meta.at("size").get<uint64_t>() || sha256(data) != meta.at("sha256").get<std::string>()) {
      refuse(path, "member " + name + " fails its sha256 check (modified or corrupted); " + kRebuild);
    }
    if (name == "runtime.json" || name == "labels.json" || is_engine_member(name)) kept.emplace(name, std::move(data));
  }
  std::vector<std::string> extra;
  for (const auto& [name, index] : present) {
    if (name != kManifest && !expected.contains(name)) extra.push_back("'" + name + "'");
  }
  if (!extra.empty()) {
    std::string list;
    for (const auto& name : extra) list += (list.empty() ? "" : ", ") + name;
    refuse(path, "members [" + list + "] are not in the manifest (tampered); " + kRebuild);
  }
  return kept;
}

PreprocessSpec parse_preprocess(const json& data, const std::string& path) {
  PreprocessSpec spec;
  spec.height = data.at("input_size").at(0).get<int64_t>();
  spec.width = data.at("input_size").at(1).get<int64_t>();
  spec.interpolation = data.at("interpolation").get<std::string>();
  spec.crop_pct = data.at("crop_pct").get<double>();
  spec.crop_mode = data.at("crop_mode").get<std::string>();
  for (int c = 0; c < 3; ++c) {
    // Python casts the contract's numbers to float32 before using them; so does the SDK.
    spec.mean[c] = static_cast<float>(data.at("mean").at(c).get<double>());
    spec.std[c] = static_cast<float>(data.at("std").at(c).get<double>());
  }
  static const std::set<std::string> interpolations = {"bicubic", "bilinear", "nearest"};
  if (!interpolations.count(spec.interpolation)) {
    refuse(path, "runtime.json asks for interpolation '" + spec.interpolation +
                     "', which trtmc does not implement (bicubic, bilinear, nearest); " + kRebuild);
  }
  if (spec.height <= 0 || spec.width <= 0 || spec.crop_pct <= 0) {
    refuse(path, "runtime.json holds an invalid input size or crop_pct; " + std::string(kRebuild));
  }
  // trtmc.preprocess keeps the aspect ratio only for a square input (one shorter-side size).
  if (spec.crop_mode != "squash" && std::floor(spec.height / spec.crop_pct) != std::floor(spec.width / spec.crop_pct)) {
    refuse(path, "runtime.json: non-square input " + std::to_string(spec.height) + "x" + std::to_string(spec.width) +
                     " with crop_mode '" + spec.crop_mode + "' is not supported; use crop_mode 'squash'");
  }
  return spec;
}

Labels parse_labels(const json& data) {
  Labels labels;
  labels.names = data.at("names").get<std::vector<std::string>>();
  labels.vocabulary_id = data.value("vocabulary_id", "");  // bundles written before it existed have none
  return labels;
}

EngineEntry parse_engine(const json& data) {
  EngineEntry entry;
  entry.key = data.at("key").get<std::string>();
  entry.backend = data.at("backend").get<std::string>();
  entry.device = data.at("device").get<std::string>();
  entry.precision = data.value("precision", "");
  entry.files = data.at("files").get<std::vector<std::string>>();
  const json& record = data.at("record");
  entry.builder = record.value("builder", "");
  entry.builder_version = record.value("builder_version", "");
  if (record.contains("versions")) entry.torch_version = record["versions"].value("torch", "");
  if (record.contains("options")) entry.io_dtype = record["options"].value("io_dtype", "f32");
  if (record.contains("compute_capabilities")) {
    entry.compute_capabilities = record["compute_capabilities"].get<std::vector<std::string>>();
  }
  return entry;
}

std::string engine_member(const EngineEntry& engine, const std::string& name) {
  return "engines/" + engine.key + "/" + name;
}

// Each engine's files, which must all be present; a file under engines/ that no engine lists is refused.
std::map<std::string, std::string> engine_members(const std::vector<EngineEntry>& engines,
                                                  std::map<std::string, std::string> members, const std::string& path) {
  std::set<std::string> keys;
  std::map<std::string, std::string> files;
  for (const EngineEntry& engine : engines) {
    if (!keys.insert(engine.key).second) refuse(path, "engine key " + engine.key + " appears twice; " + kRebuild);
    for (const std::string& file : engine.files) {
      std::string name = engine_member(engine, file);
      auto found = members.find(name);
      if (found == members.end()) refuse(path, "engine " + engine.key + " lists " + name + ", which the bundle lacks; " + kRebuild);
      files.insert(members.extract(found));
    }
  }
  for (const auto& [name, data] : members) {
    if (is_engine_member(name)) refuse(path, "member " + name + " belongs to no engine in engines; " + kRebuild);
  }
  return files;
}

}  // namespace

std::optional<std::string> normalized_digest(std::string_view text) {
  text = strip_python_whitespace(text);
  // ASCII only, whatever the host program's locale (isxdigit and tolower follow it).
  auto lower = [](char c) { return c >= 'A' && c <= 'F' ? static_cast<char>(c - 'A' + 'a') : c; };
  auto is_hex = [&](char c) { return (c >= '0' && c <= '9') || (lower(c) >= 'a' && lower(c) <= 'f'); };
  if (text.size() != 64 || !std::all_of(text.begin(), text.end(), is_hex)) return std::nullopt;
  std::string digest(text);
  std::transform(digest.begin(), digest.end(), digest.begin(), lower);
  return digest;
}

bool EngineEntry::has_file(const std::string& name) const {
  return std::find(files.begin(), files.end(), name) != files.end();
}

const std::string& Bundle::engine_file(const EngineEntry& engine, const std::string& name) const {
  auto found = engine_members.find(engine_member(engine, name));
  if (found == engine_members.end()) refuse(path, "engine " + engine.key + " has no file " + name + "; " + kRebuild);
  return found->second;
}

Bundle read_bundle(const std::string& path, const std::optional<std::string>& expect_sha256) {
  Archive archive = open_archive(path);
  zip_int64_t manifest_index = zip_name_locate(archive.get(), kManifest, 0);
  if (manifest_index < 0) refuse(path, std::string("not a trtmc bundle (no ") + kManifest + "); " + kRebuild);
  std::string raw_manifest = read_member(archive.get(), manifest_index, path, kManifest);
  Bundle bundle;
  bundle.path = path;
  bundle.digest = sha256(raw_manifest);
  check_digest(bundle.digest, expect_sha256, path);
  json manifest = parse_json(raw_manifest, path, kManifest);
  check_version(manifest, path);
  try {
    std::map<std::string, std::string> members = verified_members(archive.get(), manifest, path);
    bundle.task = manifest.value("task", "");
    bundle.preprocess = parse_preprocess(parse_json(members.at("runtime.json"), path, "runtime.json"), path);
    bundle.labels = std::make_shared<Labels>(parse_labels(parse_json(members.at("labels.json"), path, "labels.json")));
    for (const json& entry : manifest.value("engines", json::array())) bundle.engines.push_back(parse_engine(entry));
    bundle.engine_members = engine_members(bundle.engines, std::move(members), path);
  } catch (const json::exception& error) {
    refuse(path, std::string("damaged bundle (") + error.what() + "); " + kRebuild);
  } catch (const std::out_of_range&) {
    refuse(path, "damaged bundle (runtime.json or labels.json is not in the manifest); " + std::string(kRebuild));
  }
  return bundle;
}

}  // namespace trtmc::internal
