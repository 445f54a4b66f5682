// capi_profiler.cpp - C shim of the profiler section of cacheflow.h: check arguments, drain the
// engine's cf::Profiler ring, turn failures into a cf_status plus the thread's last error
// (shared with capi.cpp through capi_internal.h). No exception crosses the ABI.
#include "cacheflow.h"
#include "capi_internal.h"
#include "core/error.h"
#include "core/profiler.h"

using cf::capi::guarded;
using cf::capi::require;

extern "C" {

cf_status cf_engine_profile_drain(cf_engine_t engine, cf_profile_event * events, int32_t capacity,
                                  int32_t * out_num_events, int64_t * out_num_dropped) {
    if (out_num_events != nullptr) {
        *out_num_events = 0;
    }
    return guarded("cf_engine_profile_drain", [&] {
        require(engine != nullptr, "engine is NULL");
        require(out_num_events != nullptr, "out_num_events is NULL");
        require(events != nullptr && capacity >= 1, "events must be non-NULL with capacity >= 1");
        cf::Profiler & profiler = engine->engine.profiler();
        if (!profiler.enabled()) {
            throw cf::Error(CF_STATUS_UNSUPPORTED,
                            "profiling is off: create the engine with cf_engine_config.profile_capacity > 0");
        }
        *out_num_events = profiler.drain(events, capacity);
        if (out_num_dropped != nullptr) {
            *out_num_dropped = profiler.num_dropped();
        }
    });
}

}  // extern "C"
