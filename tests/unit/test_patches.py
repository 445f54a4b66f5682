"""The llama.cpp fetch step: sha256 pin, patch order, failure naming the patch, stamp reuse."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_fetch_module():
    spec = importlib.util.spec_from_file_location("fetch_llama_cpp", ROOT / "vendor" / "fetch_llama_cpp.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fetch = load_fetch_module()


def make_tree(root: Path) -> Path:
    """A stand-in llama.cpp tree: include/llama.h plus one source file."""
    (root / "include").mkdir(parents=True)
    (root / "include" / "llama.h").write_text("// llama.h\n")
    (root / "src").mkdir()
    (root / "src" / "a.c").write_text("int a = 1;\nint b = 2;\n")
    return root


def write_patch(path: Path, old: str, new: str) -> Path:
    path.write_text(
        "Header: what this patch changes and why.\n\n"
        "--- a/src/a.c\n+++ b/src/a.c\n@@ -1,2 +1,2 @@\n"
        f"-{old}\n+{new}\n int b = 2;\n"
    )
    return path


def test_patches_apply_in_name_order(tmp_path):
    tree = make_tree(tmp_path / "tree")
    patches = tmp_path / "patches"
    patches.mkdir()
    write_patch(patches / "0002-second.patch", "int a = 10;", "int a = 100;")
    write_patch(patches / "0001-first.patch", "int a = 1;", "int a = 10;")
    fetch.apply_patches(tree, fetch.list_patches(patches))
    assert (tree / "src" / "a.c").read_text() == "int a = 100;\nint b = 2;\n"


def test_patches_apply_inside_an_enclosing_git_checkout(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    tree = make_tree(tmp_path / "vendor" / "tree")
    patch = write_patch(tmp_path / "0001-first.patch", "int a = 1;", "int a = 10;")
    fetch.apply_patches(tree, [patch])
    assert (tree / "src" / "a.c").read_text().startswith("int a = 10;")


def test_failing_patch_is_named_and_stops(tmp_path):
    tree = make_tree(tmp_path / "tree")
    patches = tmp_path / "patches"
    patches.mkdir()
    write_patch(patches / "0001-ok.patch", "int a = 1;", "int a = 10;")
    write_patch(patches / "0002-stale.patch", "int a = 7;", "int a = 8;")
    write_patch(patches / "0003-never.patch", "int a = 10;", "int a = 11;")
    with pytest.raises(fetch.FetchError, match="patch 0002-stale.patch does not apply"):
        fetch.apply_patches(tree, fetch.list_patches(patches))
    # the patch after the failing one was not applied
    assert (tree / "src" / "a.c").read_text().startswith("int a = 10;\n")


def test_archive_sha256_mismatch_is_a_clear_error(tmp_path):
    fake = tmp_path / fetch.PIN_ARCHIVE
    fake.write_bytes(b"not the sdist")
    with pytest.raises(fetch.FetchError, match="sha256 mismatch"):
        fetch.check_archive(fake)
    with pytest.raises(fetch.FetchError, match="not found"):
        fetch.check_archive(tmp_path / "missing.tar.gz")


def local_tree_with_one_patch(tmp_path: Path, monkeypatch) -> tuple[Path, Path, Path]:
    """(source tree, patch folder holding 0001, destination) with CACHEFLOW_LLAMA_CPP_DIR set to the source."""
    src = make_tree(tmp_path / "src")
    patches = tmp_path / "patches"
    patches.mkdir()
    write_patch(patches / "0001-first.patch", "int a = 1;", "int a = 10;")
    monkeypatch.setenv("CACHEFLOW_LLAMA_CPP_DIR", str(src))
    return src, patches, tmp_path / "vendor" / "llama.cpp"


def test_prepare_from_local_tree_stamps_and_reuses(tmp_path, monkeypatch):
    src, patches, dest = local_tree_with_one_patch(tmp_path, monkeypatch)
    assert fetch.prepare(dest, patches) is True
    assert (dest / "src" / "a.c").read_text().startswith("int a = 10;")
    assert (src / "src" / "a.c").read_text().startswith("int a = 1;")  # source untouched
    assert fetch.prepare(dest, patches) is False  # stamp matches: nothing to do
    write_patch(patches / "0002-second.patch", "int a = 10;", "int a = 20;")
    assert fetch.prepare(dest, patches) is True  # new patch: fresh tree, both applied
    assert (dest / "src" / "a.c").read_text().startswith("int a = 20;")


def test_prepare_afresh_keeps_the_times_of_unchanged_files(tmp_path, monkeypatch):
    _, patches, dest = local_tree_with_one_patch(tmp_path, monkeypatch)
    assert fetch.prepare(dest, patches) is True
    old_ns = 1_000_000_000_000_000_000  # 2001: older than anything the second prepare writes
    for name in ("include/llama.h", "src/a.c"):
        os.utime(dest / name, ns=(old_ns, old_ns))
    write_patch(patches / "0002-second.patch", "int a = 10;", "int a = 20;")
    assert fetch.prepare(dest, patches) is True
    assert (dest / "include" / "llama.h").stat().st_mtime_ns == old_ns  # same bytes: not rebuilt
    assert (dest / "src" / "a.c").stat().st_mtime_ns > old_ns  # patched anew: rebuilt


def test_prepare_from_local_tree_skips_unneeded_top_level_folders_only(tmp_path, monkeypatch):
    src = make_tree(tmp_path / "src")
    (src / "models").mkdir()
    (src / "models" / "vocab.gguf").write_text("x")
    (src / "tools" / "mtmd" / "models").mkdir(parents=True)
    (src / "tools" / "mtmd" / "models" / "models.h").write_text("// needed\n")
    monkeypatch.setenv("CACHEFLOW_LLAMA_CPP_DIR", str(src))
    dest = tmp_path / "dest"
    fetch.prepare(dest, tmp_path / "no-patches")
    assert not (dest / "models").exists()
    assert (dest / "tools" / "mtmd" / "models" / "models.h").is_file()


def test_prepare_rejects_a_folder_that_is_not_llama_cpp(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("CACHEFLOW_LLAMA_CPP_DIR", str(tmp_path / "empty"))
    with pytest.raises(fetch.FetchError, match="is not a llama.cpp tree"):
        fetch.prepare(tmp_path / "dest", tmp_path / "no-patches")
    assert not (tmp_path / "dest").exists()
