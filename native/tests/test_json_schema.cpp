// test_json_schema.cpp - cf_json_schema_to_grammar over llama.cpp's converter: a schema gives its
// grammar, {} is any object, each kind of bad input is INVALID_ARGUMENT with a message saying
// why, and the buffer protocol reports the needed size. (That the grammars drive llama.cpp's
// grammar sampler is checked end to end in tests/e2e/test_server.py.)
#undef NDEBUG  // the checks must run in Release builds too
#include "cacheflow.h"

#include <cassert>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

cf_status convert(const std::string & schema, std::string * grammar) {
    char buf[4096];
    int32_t len = -1;
    const cf_status rc = cf_json_schema_to_grammar(schema.data(), (int32_t) schema.size(), buf, sizeof buf, &len);
    *grammar = rc == CF_STATUS_OK ? std::string(buf, (size_t) len) : std::string(cf_last_error());
    return rc;
}

bool contains(const std::string & text, const char * part) {
    return text.find(part) != std::string::npos;
}

void test_schemas_give_grammars() {
    std::string g;
    assert(convert(R"({"const": "42"})", &g) == CF_STATUS_OK);
    assert(contains(g, "root ::= \"\\\"42\\\"\""));
    assert(convert(R"({"type": "array", "items": {"type": "integer"}, "maxItems": 2})", &g) == CF_STATUS_OK);
    assert(contains(g, "root ::=") && contains(g, "integer"));
    std::string any_object;
    std::string typed_object;
    assert(convert("{}", &any_object) == CF_STATUS_OK);  // llama-server: {} = any object
    assert(convert(R"({"type": "object"})", &typed_object) == CF_STATUS_OK);
    assert(any_object == typed_object);
}

void test_bad_schemas_say_why() {
    std::string msg;
    assert(convert("not json", &msg) == CF_STATUS_INVALID_ARGUMENT);
    assert(contains(msg, "json_schema: not valid JSON"));
    assert(convert("123", &msg) == CF_STATUS_INVALID_ARGUMENT);
    assert(contains(msg, "json_schema: ") && contains(msg, "schema must be an object"));
    assert(convert(R"({"type": "hiccup"})", &msg) == CF_STATUS_INVALID_ARGUMENT);
    assert(contains(msg, "unrecognized type hiccup"));
    int32_t len = 0;
    assert(cf_json_schema_to_grammar(nullptr, 0, nullptr, 0, &len) == CF_STATUS_INVALID_ARGUMENT);
    assert(cf_json_schema_to_grammar("{}", -1, nullptr, 0, &len) == CF_STATUS_INVALID_ARGUMENT);
    assert(cf_json_schema_to_grammar("{}", 2, nullptr, 0, nullptr) == CF_STATUS_INVALID_ARGUMENT);
}

void test_buffer_too_small_reports_the_size() {
    const char * schema = R"({"const": "42"})";
    int32_t need = 0;
    assert(cf_json_schema_to_grammar(schema, (int32_t) std::strlen(schema), nullptr, 0, &need) ==
           CF_STATUS_BUFFER_TOO_SMALL);
    std::string buf((size_t) need, '\0');
    int32_t len = 0;
    assert(cf_json_schema_to_grammar(schema, (int32_t) std::strlen(schema), buf.data(), need, &len) == CF_STATUS_OK);
    assert(len == need);
}

}  // namespace

int main() {
    test_schemas_give_grammars();
    test_bad_schemas_say_why();
    test_buffer_too_small_reports_the_size();
    std::puts("test_json_schema: ok");
    return 0;
}
