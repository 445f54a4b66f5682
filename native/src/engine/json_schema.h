// json_schema.h - JSON schema -> GBNF grammar through llama.cpp's own converter
// (common/json-schema-to-grammar.cpp of the pinned tree, the one llama-server uses for
// `json_schema` and `response_format`). No engine or model needed.
#pragma once

#include <string>

namespace cf {

// The GBNF grammar (rule "root") of schema_json, a JSON schema as UTF-8 JSON text, as
// llama-server builds it: an empty object ({}) means any JSON object. Thread-safe (the converter
// keeps no global state). Throws Error(INVALID_ARGUMENT) with a message starting "json_schema: "
// for text that is not JSON or a schema the converter rejects (its reason follows).
std::string json_schema_to_grammar(const std::string & schema_json);

}  // namespace cf
