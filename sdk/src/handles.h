// The structs behind trtmc.h's opaque handles. Only c_api.cpp and the contract tests see them.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bundle.h"
#include "engines.h"
#include "trtmc.h"

struct trtmc_status {
  trtmc_code code;
  std::string message;
};

struct trtmc_model {
  trtmc::internal::PreprocessSpec preprocess;
  std::shared_ptr<const trtmc::internal::Labels> labels;
  trtmc::internal::ChosenEngine chosen;
  std::string digest;  // the bundle's manifest digest
  std::mutex run_lock;  // one engine call at a time per model
  std::atomic<uint64_t> engine_calls{0};  // lets the contract tests prove rejection before inference
};

// Owns its logits; shares the label set with the model (and outlives it).
struct trtmc_scores {
  std::vector<float> logits;
  std::shared_ptr<const trtmc::internal::Labels> labels;
  std::string engine;
};
