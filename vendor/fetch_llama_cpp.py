#!/usr/bin/env python3
"""Fetch the pinned llama.cpp tree and apply CacheFlow's patches to it.

The tree is the one vendored inside the PyPI source distribution of llama-cpp-python (see
PIN below and shared/ARCHITECTURE.md). CMake runs this script at configure time; it is also a
module so that tests can drive the patch step on a scratch tree.

Sources, in order of preference:
  1. CACHEFLOW_LLAMA_CPP_DIR: an already unpacked llama.cpp tree (copied, then patched).
  2. CACHEFLOW_LLAMA_CPP_ARCHIVE: a downloaded llama_cpp_python-<version>.tar.gz (sha256 checked).
  3. The download cache (<cache>/cacheflow/downloads), else `pip download` into it.

The destination holds a stamp naming the source and the sha256 of every patch; when the stamp
matches, nothing is done, otherwise the tree is unpacked and patched afresh, and its files whose
bytes did not change keep their old times (a patch change rebuilds only what it touched).

Exit status: 0 on success; 1 with a one-line "error: ..." message on stderr otherwise.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PIN_PACKAGE = "llama-cpp-python"
PIN_VERSION = "0.3.36"
PIN_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PIN_ARCHIVE = f"llama_cpp_python-{PIN_VERSION}.tar.gz"
PIN_TREE = f"llama_cpp_python-{PIN_VERSION}/vendor/llama.cpp/"
STAMP_NAME = ".cacheflow-stamp"

# Parts of the tree the build never reads; skipped when unpacking to save disk and time.
SKIP_TOP_DIRS = ("models/", "docs/", "media/", "tests/", "examples/", "pocs/", "benches/")


class FetchError(RuntimeError):
    """A fetch or patch step failed; the message is meant for the user."""


def sha256_file(path: Path) -> str:
    """Return the hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_dir() -> Path:
    """Return the user's CacheFlow cache directory (CACHEFLOW_CACHE_DIR, XDG, ~/.cache)."""
    if os.environ.get("CACHEFLOW_CACHE_DIR"):
        return Path(os.environ["CACHEFLOW_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cacheflow"


def check_archive(path: Path) -> None:
    """Raise FetchError unless the archive's sha256 equals the pin."""
    if not path.is_file():
        raise FetchError(f"llama.cpp archive not found: {path}")
    actual = sha256_file(path)
    if actual != PIN_SHA256:
        raise FetchError(
            f"sha256 mismatch for {path}: expected {PIN_SHA256}, got {actual} "
            f"(not the {PIN_PACKAGE}=={PIN_VERSION} source distribution)"
        )


def download_archive(dest_dir: Path) -> Path:
    """Download the pinned sdist with pip into dest_dir and return its path.

    --no-build-isolation keeps pip from building the sdist's build dependencies from source
    (which --no-binary :all: would otherwise force); metadata preparation is cheap.
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--no-build-isolation", "-d", str(dest_dir), f"{PIN_PACKAGE}=={PIN_VERSION}"]
    print("cacheflow: downloading llama.cpp:", " ".join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
    archive = dest_dir / PIN_ARCHIVE
    if proc.returncode != 0 or not archive.is_file():
        raise FetchError(
            f"pip download of {PIN_PACKAGE}=={PIN_VERSION} failed (exit {proc.returncode}); "
            "set CACHEFLOW_LLAMA_CPP_ARCHIVE to a local copy of " + PIN_ARCHIVE
        )
    return archive


def locate_archive() -> Path:
    """Return a verified archive path from the environment, the cache, or a download."""
    env = os.environ.get("CACHEFLOW_LLAMA_CPP_ARCHIVE")
    if env:
        archive = Path(env).expanduser()
        check_archive(archive)
        return archive
    cached = cache_dir() / "downloads" / PIN_ARCHIVE
    if cached.is_file() and sha256_file(cached) == PIN_SHA256:
        return cached
    archive = download_archive(cached.parent)
    check_archive(archive)
    return archive


def unpack_tree(archive: Path, dest: Path) -> None:
    """Extract the llama.cpp tree of the sdist into dest (which must not exist)."""
    with tarfile.open(archive, "r:gz") as tar:
        members = []
        for member in tar.getmembers():
            if not member.name.startswith(PIN_TREE):
                continue
            rel = member.name[len(PIN_TREE):]
            if not rel or rel.startswith(SKIP_TOP_DIRS) or rel in (".git", ".gitmodules"):
                continue  # .git is a submodule pointer into llama-cpp-python's own repo
            if not (member.isfile() or member.isdir()):
                continue  # no links or devices from an archive
            member.name = rel
            members.append(member)
        if not members:
            raise FetchError(f"{archive} has no {PIN_TREE} tree")
        dest.mkdir(parents=True)
        tar.extractall(dest, members=members)


def list_patches(patch_dir: Path) -> list[Path]:
    """Return patches/NNNN-*.patch in apply order."""
    if not patch_dir.is_dir():
        return []
    return sorted(p for p in patch_dir.glob("*.patch") if p.is_file())


def _patch_cmd(tree: Path, patch: Path, check: bool) -> list[str]:
    if shutil.which("git"):
        cmd = ["git", "apply", "--whitespace=nowarn", "-p1"]
        return cmd + (["--check"] if check else []) + [str(patch)]
    cmd = ["patch", "-p1", "--forward", "--batch", "-i", str(patch)]
    return cmd + (["--dry-run"] if check else [])


def apply_patches(tree: Path, patches: list[Path]) -> None:
    """Apply patches to tree in order; each is checked before it is applied.

    Raises:
        FetchError: naming the first patch that does not apply cleanly, with the tool's output.
    """
    # The tree usually sits inside CacheFlow's own git checkout; without a ceiling, `git apply`
    # would resolve paths against that repository and silently skip files outside cwd.
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(Path(tree).resolve().parent))
    for patch in patches:
        for check in (True, False):
            proc = subprocess.run(_patch_cmd(tree, patch, check), cwd=tree, env=env,
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                detail = (proc.stderr or proc.stdout).strip().splitlines()[:8]
                raise FetchError(
                    f"patch {patch.name} does not apply to llama.cpp {PIN_VERSION} tree "
                    f"{tree}:\n  " + "\n  ".join(detail)
                )


def _top_level_ignore(root: Path):
    """copytree ignore function skipping SKIP_TOP_DIRS and .git at the tree's top level only
    (tools/mtmd/models/ and the like are needed)."""
    skip = {d.rstrip("/") for d in SKIP_TOP_DIRS} | {".git", ".gitmodules"}
    root = root.resolve()

    def ignore(directory: str, names: list[str]) -> set[str]:
        return skip.intersection(names) if Path(directory).resolve() == root else set()

    return ignore


def stamp_text(source: str, patches: list[Path]) -> str:
    """Return the stamp content for a source and a patch list."""
    # The script's own hash: a change in how the tree is prepared prepares it afresh.
    lines = [f"source {source}", f"fetch {sha256_file(Path(__file__))}"]
    lines += [f"patch {p.name} {sha256_file(p)}" for p in patches]
    return "\n".join(lines) + "\n"


def keep_unchanged_times(new: Path, old: Path) -> None:
    """Give every file of the tree `new` whose bytes equal its namesake in `old` that file's access
    and modification times, so that after a patch change the build (which compares times) recompiles
    only what the change touched: a patch to src/ then leaves ggml's CUDA kernels built."""
    for path in new.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        prev = old / path.relative_to(new)
        try:
            st = prev.stat()
        except OSError:
            continue
        if st.st_size == path.stat().st_size and filecmp.cmp(path, prev, shallow=False):
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def prepare(dest: Path, patch_dir: Path) -> bool:
    """Make dest a patched llama.cpp tree; return True if it was (re)built.

    The tree is built in a temporary sibling folder and renamed into place, so an interrupted
    run never leaves a half-patched tree behind.
    """
    tree_env = os.environ.get("CACHEFLOW_LLAMA_CPP_DIR")
    patches = list_patches(patch_dir)
    source = f"dir:{Path(tree_env).resolve()}" if tree_env else f"sdist:{PIN_SHA256}"
    stamp = stamp_text(source, patches)
    stamp_path = dest / STAMP_NAME
    if stamp_path.is_file() and stamp_path.read_text() == stamp:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".llama.cpp-", dir=dest.parent))
    try:
        work = tmp / "tree"
        if tree_env:
            src = Path(tree_env).expanduser()
            if not (src / "include" / "llama.h").is_file():
                raise FetchError(f"CACHEFLOW_LLAMA_CPP_DIR={src} is not a llama.cpp tree")
            shutil.copytree(src, work, symlinks=False, ignore=_top_level_ignore(src))
        else:
            unpack_tree(locate_archive(), work)
        apply_patches(work, patches)
        (work / STAMP_NAME).write_text(stamp)
        if dest.exists():
            keep_unchanged_times(work, dest)
            shutil.rmtree(dest)
        work.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, required=True, help="where the patched tree goes")
    parser.add_argument("--patches", type=Path, required=True, help="folder of NNNN-*.patch")
    args = parser.parse_args(argv)
    try:
        rebuilt = prepare(args.dest, args.patches)
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    state = "prepared" if rebuilt else "up to date"
    print(f"cacheflow: llama.cpp tree {state} at {args.dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
