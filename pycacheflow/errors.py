"""Exception classes of CacheFlow.

Every failing ``cf_*`` call is turned into one of these by ``pycacheflow._native._check``; the
message is the native ``cf_last_error()`` text. Classes also derive from the closest builtin
(``ValueError`` for bad input, ``LookupError`` for unknown ids, ...) so callers that do not know
CacheFlow can still catch them sensibly.
"""

from __future__ import annotations


class CacheFlowError(Exception):
    """Base class of all CacheFlow errors.

    Attributes:
        status: the native ``cf_status`` code (negative int), or None for errors raised by
            Python code without a native call.
    """

    def __init__(self, message: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class InvalidArgumentError(CacheFlowError, ValueError):
    """A value out of range (CF_STATUS_INVALID_ARGUMENT); the message names the argument."""


class ModelLoadError(CacheFlowError):
    """The model file is missing, unreadable or corrupt (CF_STATUS_MODEL_LOAD_FAILED)."""


class PromptTooLongError(CacheFlowError, ValueError):
    """The prompt plus one generated token does not fit a sequence (CF_STATUS_PROMPT_TOO_LONG)."""


class OutOfMemoryError(CacheFlowError, MemoryError):
    """The KV cache or block pool cannot be allocated (CF_STATUS_OUT_OF_MEMORY)."""


class NotFoundError(CacheFlowError, LookupError):
    """Unknown or already finished request id (CF_STATUS_NOT_FOUND)."""


class UnsupportedError(CacheFlowError):
    """A feature not available for this model or build (CF_STATUS_UNSUPPORTED)."""


class BufferTooSmallError(CacheFlowError):
    """An output buffer was too small (CF_STATUS_BUFFER_TOO_SMALL); the bindings retry."""


class DecodeError(CacheFlowError, RuntimeError):
    """llama_decode failed (CF_STATUS_DECODE_FAILED); the affected requests end with "error"."""


class ShutdownError(CacheFlowError, RuntimeError):
    """The engine is stopping or closed and takes no new requests (CF_STATUS_SHUTDOWN)."""


class InternalError(CacheFlowError, RuntimeError):
    """A bug in CacheFlow (CF_STATUS_INTERNAL); the message says where."""


class ModelDownloadError(CacheFlowError):
    """The default model could not be fetched, extracted or verified."""


__all__ = [
    "CacheFlowError",
    "InvalidArgumentError",
    "ModelLoadError",
    "PromptTooLongError",
    "OutOfMemoryError",
    "NotFoundError",
    "UnsupportedError",
    "BufferTooSmallError",
    "DecodeError",
    "ShutdownError",
    "InternalError",
    "ModelDownloadError",
]
