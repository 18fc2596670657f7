"""Where ``import gpuworkbench`` points NVTX (``trace/cupti/nvtx.py``): at the libcupti of nvidia's wheels, never over
a user's own setting, never with GPUWB_NVTX=0, and a warning where it names another copy than the one loaded."""

from __future__ import annotations

import sys
import types

import pytest

from gpuworkbench.trace.cupti import nvtx


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    """A fake ``nvidia`` namespace package holding cu13/lib/libcupti.so.13, and a cupti-python that is 'installed'."""
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcupti.so.13").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)
    monkeypatch.setitem(sys.modules, "cupti", types.ModuleType("cupti"))
    monkeypatch.setattr(nvtx.importlib.util, "find_spec", _spec_with_cupti(nvtx.importlib.util.find_spec))
    _unset(monkeypatch)
    return str((lib / "libcupti.so.13").resolve())


def _unset(monkeypatch) -> None:
    """Unset both variables, restored as they were after the test (whatever ``point_nvtx_at_cupti`` sets)."""
    for name in (nvtx.ENV, "GPUWB_NVTX"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def _spec_with_cupti(find_spec):
    def spec(name, *args):
        if name == "cupti":
            return types.SimpleNamespace(name="cupti")
        return find_spec(name, *args)

    return spec


def test_points_at_the_wheel_libcupti(wheels, monkeypatch):
    said = nvtx.point_nvtx_at_cupti()
    assert nvtx.os.environ[nvtx.ENV] == wheels and wheels in said
    assert nvtx.mismatch(wheels) == ""
    warning = nvtx.mismatch("/usr/local/cuda/lib64/libcupti.so.13")
    assert "cannot reach this trace" in warning and wheels in warning


def test_a_users_setting_and_the_opt_out_are_kept(wheels, monkeypatch):
    monkeypatch.setenv(nvtx.ENV, "/opt/mine/libcupti.so")
    assert "set already" in nvtx.point_nvtx_at_cupti()
    assert nvtx.os.environ[nvtx.ENV] == "/opt/mine/libcupti.so"
    monkeypatch.delenv(nvtx.ENV)
    monkeypatch.setenv("GPUWB_NVTX", "0")
    assert "left alone" in nvtx.point_nvtx_at_cupti() and nvtx.ENV not in nvtx.os.environ


def test_without_cupti_python_nvtx_is_left_alone(monkeypatch):
    _unset(monkeypatch)
    real = nvtx.importlib.util.find_spec
    monkeypatch.setattr(nvtx.importlib.util, "find_spec", lambda name, *a: None if name == "cupti" else real(name, *a))
    assert "not installed" in nvtx.point_nvtx_at_cupti() and nvtx.ENV not in nvtx.os.environ
