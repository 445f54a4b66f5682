// capi_json_schema.cpp - C shim of cf_json_schema_to_grammar (cacheflow.h) over
// engine/json_schema.h.
#include "cacheflow.h"
#include "capi_internal.h"
#include "engine/json_schema.h"

#include <cstring>
#include <string>

using cf::capi::guarded;
using cf::capi::require;

extern "C" {

cf_status cf_json_schema_to_grammar(const char * schema, int32_t schema_len, char * buf, int32_t capacity,
                                    int32_t * out_len) {
    return guarded("cf_json_schema_to_grammar", [&] {
        require(out_len != nullptr, "out_len is NULL");
        *out_len = 0;
        require(schema != nullptr && schema_len >= 0, "schema must be non-NULL with schema_len >= 0");
        require(capacity >= 0 && (buf != nullptr || capacity == 0), "buf must hold capacity >= 0 bytes");
        const std::string grammar = cf::json_schema_to_grammar(std::string(schema, (size_t) schema_len));
        if (grammar.size() > (size_t) INT32_MAX) {
            throw cf::Error(CF_STATUS_INTERNAL, "cf_json_schema_to_grammar: grammar over 2 GiB");
        }
        const auto need = (int32_t) grammar.size();
        if (need > capacity) {
            *out_len = need;
            throw cf::Error(CF_STATUS_BUFFER_TOO_SMALL, "grammar buffer holds " + std::to_string(capacity) +
                                                            " bytes but " + std::to_string(need) + " are needed");
        }
        std::memcpy(buf, grammar.data(), grammar.size());
        *out_len = need;
    });
}

}  // extern "C"
