// capi_internal.h - what the C shim files (capi.cpp, capi_block_manager.cpp, capi_profiler.cpp)
// share: the engine behind cf_engine_t, the calling thread's last error and the guard that turns
// exceptions into a cf_status.
// Include only from shim files; core and engine code throw cf::Error instead.
#pragma once

#include "cacheflow.h"
#include "core/error.h"
#include "engine/engine.h"

#include <exception>
#include <new>
#include <string>

// The object behind cf_engine_t (created by cf_engine_init in capi.cpp).
struct cf_engine {
    explicit cf_engine(const cf::EngineConfig & config) : engine(config) {}
    cf::Engine engine;
};

namespace cf::capi {

// Store message as the calling thread's cf_last_error() and return status. Defined in capi.cpp,
// next to the one thread-local it writes.
cf_status set_error(cf_status status, const std::string & message);

// Run body; map exceptions to statuses. `fn` names the C function in internal-error messages.
template <typename Body> cf_status guarded(const char * fn, Body && body) {
    try {
        body();
        return CF_STATUS_OK;
    } catch (const cf::Error & e) {
        return set_error(e.status(), e.what());
    } catch (const std::bad_alloc &) {
        return set_error(CF_STATUS_OUT_OF_MEMORY, std::string(fn) + ": out of memory");
    } catch (const std::exception & e) {
        return set_error(CF_STATUS_INTERNAL, std::string(fn) + ": internal error: " + e.what());
    } catch (...) {
        return set_error(CF_STATUS_INTERNAL, std::string(fn) + ": internal error: unknown exception");
    }
}

// Throw INVALID_ARGUMENT with message unless ok.
inline void require(bool ok, const char * message) {
    if (!ok) {
        cf::fail_invalid(message);
    }
}

}  // namespace cf::capi
