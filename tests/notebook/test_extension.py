"""The JupyterLab extension as shipped: built into the wheel, and speaking the same protocol as the kernel end,
gpuworkbench/notebook/comm.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from support import ROOT

from gpuworkbench.notebook import comm

EXTENSION = ROOT / "extension"
SHARE = "share/jupyter/labextensions/gpuworkbench/"


def test_front_end_speaks_the_kernels_protocol() -> None:
    source = (EXTENSION / "src" / "protocol.ts").read_text()
    assert re.search(rf"export const TARGET = '{comm.TARGET}';", source)
    assert re.search(rf"export const PROTOCOL_VERSION = {comm.PROTOCOL_VERSION};", source)
    methods = re.search(r"export type Method = ([^;]+);", source).group(1)
    assert sorted(re.findall(r"'(\w+)'", methods)) == sorted(comm.METHOD_PARAMS)


def interface_fields(source: str, name: str) -> dict[str, bool]:
    """The fields of the TypeScript interface ``name`` in ``source``: field → whether it is optional (``x?:``)."""
    body = re.search(rf"export interface {name} {{(.*?)\n}}", source, re.S).group(1)
    return {m.group(1): bool(m.group(2)) for m in re.finditer(r"^\s+(\w+)(\??):", body, re.M)}


def test_front_end_reads_every_field_of_a_trace_and_its_counters() -> None:
    """protocol.ts's ITrace, ICounterDevice and ICounter name exactly the fields the kernel sends (``trace_entry`` of
    a CPU trace with counters); ``counters`` is optional, so that a kernel that sends none still speaks."""
    import gpuworkbench as gw
    from gpuworkbench.notebook import history

    with gw.trace(counters=True) as trace:
        gw.Device("cpu").alloc(16).free()
    record = history.TraceRecord(1, time.time(), 0.01, (trace.started_ns, trace.stopped_ns), None, None, None, trace)
    entry = comm.trace_entry(record)
    source = (EXTENSION / "src" / "protocol.ts").read_text()
    fields = interface_fields(source, "ITrace")
    assert set(fields) == set(entry) and [f for f, optional in fields.items() if optional] == ["counters"]
    host = entry["counters"][0]
    assert host["device"] == "host" and host["counters"], entry["counters"]
    assert set(interface_fields(source, "ICounterDevice")) == set(host)
    assert set(interface_fields(source, "ICounter")) == set(host["counters"][0])


def test_package_name_is_the_shared_data_folder() -> None:
    assert json.loads((EXTENSION / "package.json").read_text())["name"] == "gpuworkbench"
    assert json.loads((EXTENSION / "install.json").read_text())["packageName"] == "gpuworkbench"


@pytest.mark.slow
def test_wheel_ships_the_prebuilt_extension(tmp_path: Path) -> None:
    built = EXTENSION / "labextension" / "package.json"
    if not built.exists():
        pytest.skip("the extension is not built: run `npm install && npm run build` in extension/ (./run test does)")
    env = dict(os.environ, HATCH_JUPYTER_BUILDER_SKIP_NPM="1")  # package what is built; never run npm here
    command = [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--quiet", "--wheel-dir", str(tmp_path)]
    subprocess.run(command, env=env, check=True, timeout=600)
    (wheel,) = tmp_path.glob("gpuworkbench-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (data,) = {n[: n.index(SHARE) + len(SHARE)] for n in names if SHARE in n}
        shipped = json.loads(archive.read(data + "package.json"))
        assert json.loads(archive.read(data + "install.json"))["packageName"] == "gpuworkbench"
    assert shipped["name"] == "gpuworkbench"
    assert data + shipped["jupyterlab"]["_build"]["load"] in names  # the remote entry Lab loads
    assert not [n for n in names if "node_modules" in n or n.endswith(".ts")]
