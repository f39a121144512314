// Internal errors: a Failure carries the trtmc_code the C ABI returns and a message that names the
// problem and the fix. Failures never cross the C boundary (c_api.cpp turns them into statuses).
#pragma once

#include <stdexcept>
#include <string>

#include "trtmc.h"

namespace trtmc::internal {

class Failure : public std::runtime_error {
 public:
  Failure(trtmc_code code, const std::string& message) : std::runtime_error(message), code_(code) {}
  trtmc_code code() const { return code_; }

 private:
  trtmc_code code_;
};

}  // namespace trtmc::internal
