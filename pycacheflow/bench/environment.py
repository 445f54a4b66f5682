"""Facts recorded with every result (BENCHMARKS.md "Reporting") and the measured memory
bandwidth used for the hardware ceiling."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

COPY_BUFFER_BYTES = 256 << 20
COPY_REPEATS = 7


def git_commit(cwd: str | os.PathLike[str] | None = None) -> str:
    """Short commit of the CacheFlow checkout (with "-dirty" when tracked files differ).

    Run from a checkout, git answers; installed (site-packages), the commit the native library
    was built from (``cf_version()``); "" when neither knows.
    """
    root = Path(cwd) if cwd else Path(__file__).resolve().parents[2]
    if (root / ".git").exists():
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "--short=7", "HEAD"],
                cwd=root,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root,
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            return commit + ("-dirty" if dirty else "")
        except (OSError, subprocess.CalledProcessError):
            pass
    return build_commit()


def build_commit() -> str:
    """The CacheFlow commit the loaded native library was built from; "" if unknown."""
    try:
        from pycacheflow._native import version
    except (ImportError, OSError):
        return ""
    head = version().split(" ", 1)[0]
    return head.split("+", 1)[1] if "+" in head else ""


def native_build_type(version: str) -> str:
    """CMake's build type the native library names in its version (cf_version: "0.1.0+1a2b3c4 (llama.cpp 0c1e570,
    Release)"); "" if it names none."""
    inside = version.rpartition("(")[2].rstrip(")")
    return inside.split(", ", 1)[1] if ", " in inside else ""


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (else platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_model() -> str:
    """GPU names from nvidia-smi, comma-separated; "" when there is none."""
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return ", ".join(line.strip() for line in proc.stdout.splitlines() if line.strip())


def measure_copy_bandwidth(
    num_bytes: int = COPY_BUFFER_BYTES, repeats: int = COPY_REPEATS, threads: int = 1
) -> float:
    """Memory copy bandwidth in bytes/s: numpy copies of a buffer much larger than the caches,
    split over ``threads`` threads (numpy releases the GIL while copying); median of
    ``repeats`` after one warm-up copy. Counts bytes read plus bytes written (the STREAM "copy"
    convention), so it approximates what a read-bound decode step can stream.
    """
    import numpy as np

    src = np.ones(num_bytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    chunks = np.array_split(np.arange(src.size), max(1, threads))
    bounds = [(int(c[0]), int(c[-1]) + 1) for c in chunks if c.size]

    def copy_part(bound: tuple[int, int]) -> None:
        np.copyto(dst[bound[0] : bound[1]], src[bound[0] : bound[1]])

    times = []
    with ThreadPoolExecutor(max_workers=len(bounds)) as pool:
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            list(pool.map(copy_part, bounds))
            if i > 0:
                times.append(time.perf_counter() - t0)
    return 2 * src.nbytes / statistics.median(times)


def environment(
    model_path: str, threads: int, build_type: str = "", library_build_type: bool = True
) -> dict[str, object]:
    """The environment record stored in every results JSON.

    library_build_type: with no ``build_type``, take the loaded native library's (False where the library measured
    is not this process's: ``bench serve`` measures a server, maybe llama-server)."""
    import pycacheflow

    try:
        from pycacheflow import _native

        version = _native.version()
    except ImportError:
        version = ""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "cacheflow_version": pycacheflow.__version__,
        "native_version": version,
        "build_type": build_type or (native_build_type(version) if library_build_type else ""),
        "model": os.path.basename(model_path),
        "model_path": str(model_path),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu": gpu_model(),
        "threads": threads,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
