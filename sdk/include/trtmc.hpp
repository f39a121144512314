// trtmc.hpp: a header-only C++17 wrapper over trtmc.h. RAII owners for the C handles and
// trtmc::Error (carrying the C status code) for failed calls; nothing the C ABI cannot do.
//
//   trtmc::ImageToClassScores model("lite0.bundle", digest);  // digest: what `trtmc inspect` prints
//   trtmc::Scores scores = model(pixels.data(), pixels.size(), height, width);
//   // scores outlive model; scores.logits() holds every logit in checkpoint order
#ifndef TRTMC_HPP
#define TRTMC_HPP

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "trtmc.h"

namespace trtmc {

class Error : public std::runtime_error {
 public:
  Error(trtmc_code code, const std::string& message) : std::runtime_error(message), code_(code) {}
  trtmc_code code() const noexcept { return code_; }
  const char* code_name() const noexcept { return trtmc_code_name(code_); }

 private:
  trtmc_code code_;
};

namespace detail {
struct StatusDeleter {
  void operator()(trtmc_status* status) const noexcept { trtmc_status_release(status); }
};
struct ModelDeleter {
  void operator()(trtmc_model* model) const noexcept { trtmc_model_release(model); }
};
struct ScoresDeleter {
  void operator()(trtmc_scores* scores) const noexcept { trtmc_scores_release(scores); }
};

inline std::string text(const char* value) { return value ? value : ""; }

// Takes ownership of a status; throws when it reports an error.
inline void check(trtmc_status* raw) {
  std::unique_ptr<trtmc_status, StatusDeleter> status(raw);
  if (status) throw Error(trtmc_status_code(status.get()), trtmc_status_message(status.get()));
}
}  // namespace detail

// The result of one call: every logit, the label names, the vocabulary id and the engine. It owns
// all of it, so it stays valid after the model that produced it is gone.
class Scores {
 public:
  explicit Scores(trtmc_scores* scores) : scores_(scores) {}

  const float* data() const noexcept { return trtmc_scores_logits(scores_.get()); }
  std::size_t size() const noexcept { return trtmc_scores_count(scores_.get()); }
  std::vector<float> logits() const { return std::vector<float>(data(), data() + size()); }

  std::vector<std::string> label_names() const {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < trtmc_scores_label_count(scores_.get()); ++i) {
      names.emplace_back(trtmc_scores_label_name(scores_.get(), i));
    }
    return names;
  }
  std::string vocabulary_id() const { return detail::text(trtmc_scores_vocabulary_id(scores_.get())); }
  std::string engine() const { return detail::text(trtmc_scores_engine(scores_.get())); }
  trtmc_scores* get() const noexcept { return scores_.get(); }

 private:
  std::unique_ptr<trtmc_scores, detail::ScoresDeleter> scores_;
};

// A bundle opened for image_to_class_scores.
class ImageToClassScores {
 public:
  using Options = std::vector<std::pair<std::string, std::string>>;

  // trtmc_model_open with `options` as name/value pairs: {{"expect_sha256", digest}} is the only
  // one accepted; any other throws Error(TRTMC_ERROR_UNSUPPORTED_OPTION) (see trtmc_option).
  explicit ImageToClassScores(const std::string& bundle_path, const Options& options = {}) {
    std::vector<trtmc_option> raw;
    for (const auto& [name, value] : options) raw.push_back({name.c_str(), value.c_str()});
    trtmc_model* model = nullptr;
    detail::check(trtmc_model_open(bundle_path.c_str(), raw.empty() ? nullptr : raw.data(), raw.size(), &model));
    model_.reset(model);
  }

  // Opens the bundle only if its digest is `expect_sha256` (64 hex digits, as `trtmc inspect`
  // prints it); another bundle throws Error(TRTMC_ERROR_DIGEST_MISMATCH) before any of its engines
  // loads, a malformed digest Error(TRTMC_ERROR_INVALID_ARGUMENT).
  ImageToClassScores(const std::string& bundle_path, const std::string& expect_sha256)
      : ImageToClassScores(bundle_path, Options{{"expect_sha256", expect_sha256}}) {}

  // Host RGB float32 HWC in [0, 1]: `count` must be height * width * 3.
  Scores operator()(const float* pixels, std::size_t count, std::int64_t height, std::int64_t width) const {
    trtmc_scores* scores = nullptr;
    detail::check(trtmc_classify(model_.get(), pixels, count, height, width, &scores));
    return Scores(scores);
  }

  std::string engine() const { return detail::text(trtmc_model_engine(model_.get())); }
  // The bundle's digest (sha256 of its manifest.json), lower-case hex: what expect_sha256 pins.
  std::string digest() const { return detail::text(trtmc_model_digest(model_.get())); }
  std::vector<std::string> skipped_engines() const {
    std::vector<std::string> lines;
    for (std::size_t i = 0; i < trtmc_model_skipped_count(model_.get()); ++i) {
      lines.emplace_back(trtmc_model_skipped(model_.get(), i));
    }
    return lines;
  }
  trtmc_model* get() const noexcept { return model_.get(); }

 private:
  std::unique_ptr<trtmc_model, detail::ModelDeleter> model_;
};

}  // namespace trtmc

#endif  // TRTMC_HPP
