// json_schema.cpp - see json_schema.h.
#include "engine/json_schema.h"

#include "core/error.h"

// llama.cpp's common/ (linked as cacheflow_llama_common, see CMakeLists.txt)
#include "json-schema-to-grammar.h"
#include "json.h"

#include <stdexcept>

namespace cf {

std::string json_schema_to_grammar(const std::string & schema_json) {
    common_json schema;
    try {
        schema = common_json::parse(schema_json);
    } catch (const std::exception & e) {
        fail_invalid(std::string("json_schema: not valid JSON: ") + e.what());
    }
    if (schema.is_object() && schema.empty()) {
        schema["type"] = "object";  // llama-server's rule: {} means any object
    }
    try {
        return ::json_schema_to_grammar(schema, /*force_gbnf=*/true);
    } catch (const std::exception & e) {
        // std::invalid_argument / common_json_error with the converter's reason
        fail_invalid(std::string("json_schema: ") + e.what());
    }
}

}  // namespace cf
