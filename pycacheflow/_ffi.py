"""cffi binding (ABI mode) of libcacheflow.so: the cdef derived from cacheflow.h, and dlopen.

The cdef is not a hand-kept mirror: it is built at import time from the header itself
(``pycacheflow/include/cacheflow.h`` as installed by the build, else ``native/include/cacheflow.h``
of a source checkout), so the Python side cannot drift from the C ABI.

Nothing else lives here; ``pycacheflow._native`` is the only module that calls ``lib.*``.
"""

from __future__ import annotations

import os
import re
import site
from pathlib import Path

from cffi import FFI

_PACKAGE_DIR = Path(__file__).resolve().parent
LIB_ENV_VAR = "CACHEFLOW_LIB"
HEADER_ENV_VAR = "CACHEFLOW_HEADER"
LIB_NAME = "libcacheflow.so"

# The header's own include guard; its body is kept, every other conditional block is dropped.
_INCLUDE_GUARD = "CACHEFLOW_H"
_COMMENT_RE = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
_DEFINE_RE = re.compile(r"#\s*define\s+(\w+)(?:\s+(.*))?$")
# "(-1)", "-1", "0x10", "(16)": integer literals cffi can take once the parentheses are gone.
_INT_LITERAL_RE = re.compile(r"^\(?\s*(-?\s*(?:0[xX][0-9a-fA-F]+|\d+))[uUlL]*\s*\)?$")


def header_path() -> Path:
    """Locate cacheflow.h.

    Returns:
        ``$CACHEFLOW_HEADER`` if set, else the copy the build installs next to the package
        (``pycacheflow/include/cacheflow.h``), else ``native/include/cacheflow.h`` of a checkout.

    Raises:
        ImportError: no header was found.
    """
    override = os.environ.get(HEADER_ENV_VAR)
    candidates = [Path(override)] if override else []
    candidates += [
        _PACKAGE_DIR / "include" / "cacheflow.h",
        _PACKAGE_DIR.parent / "native" / "include" / "cacheflow.h",
    ]
    for path in candidates:
        if path.is_file():
            return path
    tried = ", ".join(str(p) for p in candidates)
    raise ImportError(f"cacheflow.h not found (tried {tried}); reinstall with pip install .")


def _strip_comments(text: str) -> str:
    # Keep newlines of block comments so line structure (and error line numbers) survive.
    return _COMMENT_RE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def _define_to_cdef(line: str) -> str | None:
    """Translate one ``#define`` line; None drops it (guards, CF_API, macros without value)."""
    m = _DEFINE_RE.match(line.strip())
    if m is None or m.group(1) == _INCLUDE_GUARD or not m.group(2):
        return None
    name, value = m.group(1), m.group(2).strip()
    lit = _INT_LITERAL_RE.match(value)
    if lit is None:
        return None  # e.g. CF_API's attribute; not a constant
    return f"#define {name} {lit.group(1).replace(' ', '')}"


def cdef_from_header(text: str) -> str:
    """Turn the text of cacheflow.h into a cdef that ``cffi.FFI().cdef`` accepts.

    Strips comments, ``#include`` lines, the include guard, every other conditional block
    (``extern "C"`` for C++, the ``CF_API`` definitions) and the ``CF_API`` marker; integer
    ``#define`` constants such as ``#define CF_TOKEN_NONE (-1)`` become
    ``#define CF_TOKEN_NONE -1``.

    Args:
        text: the full header text.

    Returns:
        The cdef source. Pure function; does not touch the file system.
    """
    out: list[str] = []
    # One entry per open #if: True where the block's body is kept (only the include guard).
    keep_stack: list[bool] = []
    for line in _strip_comments(text).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            directive = stripped[1:].strip()
            if directive.startswith(("if", "ifdef", "ifndef")):
                is_guard = directive.split()[-1] == _INCLUDE_GUARD and directive.startswith(
                    "ifndef"
                )
                keep_stack.append(is_guard and all(keep_stack))
            elif directive.startswith("endif"):
                keep_stack.pop()
            elif directive.startswith(("else", "elif")):
                keep_stack[-1] = False
            elif directive.startswith("define") and all(keep_stack):
                converted = _define_to_cdef(stripped)
                if converted is not None:
                    out.append(converted)
            continue
        if all(keep_stack):
            out.append(re.sub(r"\bCF_API\b", "", line))
    return "\n".join(out) + "\n"


def _make_ffi() -> FFI:
    result = FFI()
    result.cdef(cdef_from_header(header_path().read_text(encoding="utf-8")))
    return result


def library_path() -> Path:
    """Locate libcacheflow.so.

    Returns:
        ``$CACHEFLOW_LIB`` if set; else ``pycacheflow/lib/`` next to this module; else the copy
        in an installed ``pycacheflow/lib/`` on a site-packages path (an editable install
        imports this module from the checkout while the built library lives in
        site-packages). The first candidate is returned when none exists, so that the
        error names the expected place.
    """
    override = os.environ.get(LIB_ENV_VAR)
    if override:
        return Path(override)
    candidates = [_PACKAGE_DIR / "lib" / LIB_NAME]
    site_dirs = site.getsitepackages() + [site.getusersitepackages()]
    candidates += [Path(d) / "pycacheflow" / "lib" / LIB_NAME for d in site_dirs]
    return next((c for c in candidates if c.is_file()), candidates[0])


def load_library():  # -> cffi library object (no public type)
    """dlopen libcacheflow.so once and return the cffi library object.

    Returns:
        The lib object; repeated calls return the same one (the only cached state of the
        package).

    Raises:
        ImportError: the file is missing or cannot be loaded; the message names the path.
    """
    global _lib
    if _lib is None:
        path = library_path()
        if not path.is_file():
            raise ImportError(
                f"{LIB_NAME} not found at {path}; reinstall with pip install . "
                f"(or set {LIB_ENV_VAR} to a built library)"
            )
        try:
            _lib = ffi.dlopen(str(path))
        except OSError as exc:
            raise ImportError(f"cannot load {path}: {exc}; reinstall with pip install .") from exc
    return _lib


ffi = _make_ffi()
_lib = None
