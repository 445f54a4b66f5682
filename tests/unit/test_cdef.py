"""The cffi cdef derived from cacheflow.h parses and matches what Python relies on.

No native library is needed: the cdef is parsed, and integer constants are read through a
dlopen of the running process (constants never need a symbol).
"""

from __future__ import annotations

import re
from pathlib import Path

import cffi
import pytest

from pycacheflow import _ffi, outputs, profiler
from pycacheflow.config import (
    KV_MODES,
    LOG_LEVELS,
    PAGED_ATTENTIONS,
    POLICIES,
    PREEMPTION_MODES,
    c_enum_name,
)

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "native" / "include" / "cacheflow.h"


@pytest.fixture(scope="module")
def header_text() -> str:
    return HEADER.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def ffi(header_text) -> cffi.FFI:
    result = cffi.FFI()
    result.cdef(_ffi.cdef_from_header(header_text))
    return result


@pytest.fixture(scope="module")
def consts(ffi):
    return ffi.dlopen(None)


def declared_functions(header_text: str) -> set[str]:
    return set(re.findall(r"CF_API\s+[^;]*?\b(cf_\w+)\s*\(", header_text))


def test_cdef_has_no_preprocessor_or_cf_api(header_text):
    cdef = _ffi.cdef_from_header(header_text)
    assert "CF_API" not in cdef and "extern" not in cdef and "#include" not in cdef
    assert "#define CF_TOKEN_NONE -1" in cdef and "#define CF_SEED_RANDOM -1" in cdef


def test_every_declared_function_is_in_the_cdef(ffi, header_text):
    names = declared_functions(header_text)
    assert {"cf_engine_init", "cf_engine_free", "cf_engine_drain", "cf_last_error"} <= names
    for name in names:
        assert name in _ffi.cdef_from_header(header_text)
    assert ffi.typeof("cf_status(*)(const cf_engine_config *, cf_engine_t *)")


def test_native_module_only_calls_declared_functions(header_text):
    source = (REPO / "pycacheflow" / "_native.py").read_text()
    used = set(re.findall(r"\blib\.(cf_\w+)", source))
    assert used and used <= declared_functions(header_text)


def test_constants(consts):
    assert consts.CF_STATUS_OK == 0 and consts.CF_STATUS_INVALID_ARGUMENT < 0
    assert consts.CF_TOKEN_NONE == outputs.TOKEN_NONE
    assert consts.CF_FINISH_REASON_NONE == outputs.FINISH_REASON_NONE
    for i, name in enumerate(outputs.FINISH_REASONS):
        assert getattr(consts, "CF_FINISH_REASON_" + name.upper()) == i + 1


@pytest.mark.parametrize(
    ("prefix", "names"),
    [
        ("CF_KV_MODE_", KV_MODES),
        ("CF_SCHED_POLICY_", POLICIES),
        ("CF_LOG_LEVEL_", LOG_LEVELS),
        ("CF_PAGED_ATTENTION_", PAGED_ATTENTIONS),
        ("CF_PREEMPTION_MODE_", PREEMPTION_MODES),
    ],
)
def test_config_names_map_onto_c_enums(consts, prefix, names):
    values = [getattr(consts, c_enum_name(prefix, n)) for n in names]
    assert len(set(values)) == len(names)


@pytest.mark.parametrize(
    ("struct", "tuple_type", "extra"),
    [
        ("cf_output_event", outputs.OutputEvent, ()),
        ("cf_engine_stats", outputs.EngineStats, ("ttft_by_priority",)),
        ("cf_model_info", outputs.ModelInfo, ("kv_mode_name",)),
        ("cf_profile_event", profiler.ProfileEvent, ()),
    ],
)
def test_namedtuples_mirror_structs(ffi, struct, tuple_type, extra):
    c_fields = [name for name, _ in ffi.typeof(struct).fields]
    assert list(tuple_type._fields) == c_fields + list(extra)


def test_profile_event_kinds(consts):
    for value, name in profiler.EVENT_KIND_NAMES.items():
        assert getattr(consts, "CF_PROFILE_EVENT_" + name.upper()) == value
        assert getattr(profiler, name.upper()) == value


def test_every_status_has_an_exception_class(header_text):
    statuses = re.findall(r"\b(CF_STATUS_\w+)\s*=", header_text)
    source = (REPO / "pycacheflow" / "_native.py").read_text()
    for status in statuses:
        if status != "CF_STATUS_OK":
            assert f"lib.{status}:" in source, status


def test_conversion_rules():
    text = """
    #ifndef CACHEFLOW_H
    #define CACHEFLOW_H
    #include <stdint.h>
    #ifdef __cplusplus
    extern "C" {
    #endif
    #if defined(_WIN32)
    #define CF_API __declspec(dllexport)
    #else
    #define CF_API __attribute__((visibility("default")))
    #endif
    #define CF_A (-1)   /* sentinel */
    #define CF_B 0x10   // hex
    CF_API int32_t cf_f(int32_t x); /* a
       multi-line comment */
    #ifdef __cplusplus
    }
    #endif
    #endif
    """
    cdef = _ffi.cdef_from_header(text)
    assert "#define CF_A -1" in cdef and "#define CF_B 0x10" in cdef
    assert "__declspec" not in cdef and "visibility" not in cdef and "}" not in cdef
    f = cffi.FFI()
    f.cdef(cdef)
    assert f.typeof("int32_t(*)(int32_t)")


def test_header_path_prefers_override(monkeypatch, tmp_path):
    h = tmp_path / "x.h"
    h.write_text("int32_t cf_x(void);")
    monkeypatch.setenv(_ffi.HEADER_ENV_VAR, str(h))
    assert _ffi.header_path() == h
    monkeypatch.delenv(_ffi.HEADER_ENV_VAR)
    assert _ffi.header_path().name == "cacheflow.h"


def test_library_path_override(monkeypatch):
    monkeypatch.setenv(_ffi.LIB_ENV_VAR, "/nowhere/libcacheflow.so")
    assert _ffi.library_path() == Path("/nowhere/libcacheflow.so")
    monkeypatch.delenv(_ffi.LIB_ENV_VAR)
    assert _ffi.library_path().parts[-2:] == ("lib", "libcacheflow.so")
