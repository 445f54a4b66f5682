// error.h - the exception that carries a cf_status from deep inside the engine to capi.cpp.
//
// Internal code reports failures by throwing cf::Error; capi.cpp is the only place that catches,
// stores the message as the thread's last error and returns the status. Nothing throws across
// the C ABI.
#pragma once

#include "cacheflow.h"

#include <stdexcept>
#include <string>

namespace cf {

class Error : public std::runtime_error {
  public:
    Error(cf_status status, const std::string & message) : std::runtime_error(message), status_(status) {}

    cf_status status() const { return status_; }

  private:
    cf_status status_;
};

// Throw an INVALID_ARGUMENT error naming the argument, e.g. "temperature must be >= 0, got -1".
[[noreturn]] inline void fail_invalid(const std::string & message) {
    throw Error(CF_STATUS_INVALID_ARGUMENT, message);
}

}  // namespace cf
