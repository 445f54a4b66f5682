"""Stock llama.cpp tools built from the same pinned tree, as side-by-side baselines.

``pip install .`` keeps its CMake build folder (``build/<wheel tag>/``, see pyproject.toml) and
configures llama.cpp's tools there without building them; ``build_tool`` builds one on demand
(incremental, a minute or two the first time). ``run_batched_bench`` runs
``llama-batched-bench`` on the offline decode workload and returns its JSONL row.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class BaselineError(RuntimeError):
    """A baseline tool could not be found, built or run; the message says what to do."""


def find_build_dir(root: str | os.PathLike[str] | None = None) -> Path:
    """The persistent scikit-build folder (``build/<wheel tag>``, holding CMakeCache.txt).

    Args:
        root: the source checkout; None = the current directory, then the checkout this
            module was imported from.

    Raises:
        BaselineError: none found.
    """
    roots = [Path(root)] if root is not None else [Path.cwd(), _PACKAGE_ROOT]
    for r in roots:
        candidates = sorted(p.parent for p in (r / "build").glob("*/CMakeCache.txt"))
        if candidates:
            return candidates[-1]
    tried = ", ".join(str(r / "build") for r in roots)
    raise BaselineError(f"no CMake build folder under {tried}: run `pip install .` in the checkout")


def _cache_entry(build_dir: Path, name: str) -> str:
    """The value of CMakeCache.txt's entry ``name`` ("" if absent or unreadable)."""
    try:
        for line in (build_dir / "CMakeCache.txt").read_text().splitlines():
            if line.split(":", 1)[0] == name and "=" in line:
                return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return ""


def build_type(build_dir: Path) -> str:
    """CMAKE_BUILD_TYPE recorded in the build folder's CMakeCache.txt ("" if unknown)."""
    return _cache_entry(build_dir, "CMAKE_BUILD_TYPE")


def stale_build_tools(build_dir: Path) -> list[str]:
    """The CMakeCache.txt entries (CMAKE_COMMAND, CMAKE_MAKE_PROGRAM) naming programs that no longer exist.

    ``pip install .`` with build isolation configures the build folder with the cmake and ninja of a
    temporary environment that pip deletes afterwards; the folder then cannot build, nor regenerate itself.
    """
    return [
        name
        for name in ("CMAKE_COMMAND", "CMAKE_MAKE_PROGRAM")
        if (value := _cache_entry(build_dir, name)) and os.path.isabs(value) and not os.path.exists(value)
    ]


def _reconfigure(build_dir: Path, stale: list[str]) -> None:
    """Configure build_dir again with the cmake and ninja on PATH (its cache and source folder kept).

    Raises:
        BaselineError: cmake or ninja is not on PATH, or the configure step failed.
    """
    cmake, ninja = shutil.which("cmake"), shutil.which("ninja")
    generator = _cache_entry(build_dir, "CMAKE_GENERATOR")
    missing = [tool for tool, path in (("cmake", cmake), ("ninja", ninja)) if path is None and
               (tool == "cmake" or generator == "Ninja")]
    if missing:
        raise BaselineError(
            f"{build_dir} was configured with {' and '.join(stale)} of pip's temporary build environment, "
            f"which pip has deleted, and {' and '.join(missing)} is not on PATH to configure it again: "
            f"`pip install {' '.join(missing)}`, or reinstall with `pip install . --no-build-isolation`"
        )
    cmd = [str(cmake), "-S", _cache_entry(build_dir, "CMAKE_HOME_DIRECTORY"), "-B", str(build_dir)]
    if generator == "Ninja":
        cmd.append(f"-DCMAKE_MAKE_PROGRAM={ninja}")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BaselineError(
            f"configuring {build_dir} again (its {' and '.join(stale)} are gone) failed:\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )


def build_tool(build_dir: Path, target: str) -> Path:
    """Build a llama.cpp tool target (e.g. "llama-batched-bench", "llama-server") in the
    persistent build folder and return the executable's path. A folder configured by an isolated
    ``pip install .`` (whose cmake and ninja pip has deleted) is first configured again with the
    cmake and ninja on PATH.

    Raises:
        BaselineError: the build failed or produced no executable, or the folder needs configuring
            again and cmake or ninja is missing.
    """
    stale = stale_build_tools(build_dir)
    if stale:
        _reconfigure(build_dir, stale)
    jobs = str(os.cpu_count() or 2)
    proc = subprocess.run(
        ["cmake", "--build", str(build_dir), "--target", target, "-j", jobs],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise BaselineError(
            f"building {target} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    found = [p for p in build_dir.rglob(target) if p.is_file() and os.access(p, os.X_OK)]
    if not found:
        raise BaselineError(f"{target} not found under {build_dir} after building it")
    return found[0]


@dataclass(frozen=True)
class BatchedBenchResult:
    """One llama-batched-bench row: npl sequences of npp prompt and ntg generated tokens.

    Attributes:
        t_pp_s, t_tg_s, t_s: prompt, generation and total seconds.
        speed_pp, speed_tg, speed: prompt tokens/s, generated tokens/s (S_TG), all tokens/s.
    """

    npp: int
    ntg: int
    npl: int
    t_pp_s: float
    t_tg_s: float
    t_s: float
    speed_pp: float
    speed_tg: float
    speed: float

    @property
    def output_throughput(self) -> float:
        """Generated tokens per second over the whole run (prompt processing included)."""
        return self.npl * self.ntg / self.t_s if self.t_s > 0 else 0.0


def run_batched_bench(
    exe: Path,
    model: str,
    npp: int,
    ntg: int,
    npl: int,
    threads: int,
    ctx: int | None = None,
    attempts: int = 3,
) -> BatchedBenchResult:
    """Run ``llama-batched-bench -npp NPP -ntg NTG -npl NPL`` once (default split KV cache,
    ``-b 2048 -ub 512``) and parse its JSONL row; up to ``attempts`` runs when its output
    line was lost.

    Raises:
        BaselineError: it failed, or printed no row in any attempt.
    """
    ctx = ctx or npl * (npp + ntg)
    cmd = [str(exe), "-m", model, "-c", str(ctx), "-b", "2048", "-ub", "512",
           "-npp", str(npp), "-ntg", str(ntg), "-npl", str(npl),
           "-t", str(threads), "-tb", str(threads), "--output-format", "jsonl"]  # fmt: skip
    # llama.cpp's logger prints from a worker thread and may lose the last line at exit (its
    # common/log.cpp says so) on a loaded machine: try again rather than fail the whole run.
    for _ in range(attempts):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = (proc.stdout + "\n" + proc.stderr).splitlines()
        rows = [json.loads(line) for line in lines if line.startswith("{")]
        if proc.returncode != 0 or rows:
            break
    if proc.returncode != 0 or not rows:
        raise BaselineError(
            f"llama-batched-bench failed ({proc.returncode}, {attempts} attempts): "
            f"{' '.join(cmd)}\n{proc.stderr[-2000:]}"
        )
    r = rows[-1]
    return BatchedBenchResult(
        npp=npp,
        ntg=ntg,
        npl=npl,
        t_pp_s=r["t_pp"],
        t_tg_s=r["t_tg"],
        t_s=r["t"],
        speed_pp=r["speed_pp"],
        speed_tg=r["speed_tg"],
        speed=r["speed"],
    )
