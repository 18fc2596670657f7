"""Several devices: peer copies (Buffer.copy_from across devices), the summary's cross-device figures and advice, and
the links between GPUs in the ``%gpu`` listing.

Two OpenCL devices come from PoCL with ``POCL_DEVICES="pthread pthread"``, which PoCL reads once per process: those
tests run their script in a subprocess. The CPU backend has one device (``Device("cpu")`` is shared), so a copy
between "two CPU devices" is a copy on one. CUDA peer copies are ``gpu`` tests; the two-GPU ones skip with fewer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support import cuda_devices, pocl_index, sample

import gpuworkbench as gw
from gpuworkbench.trace.analysis import cross_device, summarize
from gpuworkbench.trace.recorder import Trace
from gpuworkbench.trace.spans import PEER_ROUTES, parse_peer_copy, peer_copy_name, table_from_records

MS = 1_000_000


# ------------------------------------------------------------------------------------------------ span names
def test_peer_copy_names_round_trip():
    for route in PEER_ROUTES:
        name = peer_copy_name("p2p 4.0 MiB", "cuda:1", "cuda:0", route)
        assert parse_peer_copy(name) == ("cuda:1", "cuda:0", route)
    assert parse_peer_copy("d2d 4.0 MiB") is None
    assert parse_peer_copy("p2p [cuda:1 → cuda:0, sideways]") is None
    with pytest.raises(ValueError, match="unknown peer route"):
        peer_copy_name("x", "cuda:0", "cuda:1", "teleported")


# ------------------------------------------------------------------------------------------------ CPU and errors
def test_cpu_backend_has_one_device():
    assert gw.Device("cpu") is gw.Device(0, backend="cpu")  # two gw.Device("cpu") are one device
    with pytest.raises(gw.BackendUnavailable, match="cpu has no device 1"):
        gw.Device("cpu:1")


def test_copy_between_cpu_buffers_is_a_copy_on_one_device():
    dev = gw.Device("cpu")
    data = sample(1000, "int32")
    with dev.alloc(1000, "int32") as a, gw.Device("cpu").alloc(1000, "int32") as b, gw.trace() as t:
        a.copy_from_host(data)
        b.copy_from(a).wait()
        assert np.array_equal(b.copy_to_host(), data)
    d2d = [sp for sp in t.spans if sp.kind == "d2d"]
    assert len(d2d) == 1 and parse_peer_copy(d2d[0].name) is None


def test_copy_between_two_backends_is_refused_naming_both():
    index = pocl_index()
    if index is None:
        pytest.skip("no PoCL OpenCL device here")
    cpu, cl = gw.Device("cpu"), gw.Device(index, backend="opencl")
    with cpu.alloc(64) as a, cl.alloc(64) as b:
        for dst, src in ((a, b), (b, a)):
            with pytest.raises(gw.InvalidArgument, match="two devices of one backend") as info:
                dst.copy_from(src)
            assert "cpu:0" in str(info.value) and f"opencl:{index}" in str(info.value)


# ------------------------------------------------------------------------------------------------ two PoCL devices
_TWO_POCL = r"""
import json, sys
import numpy as np
import gpuworkbench as gw
from gpuworkbench.trace.spans import parse_peer_copy

found = [i.index for i in gw.devices() if i.backend == "opencl" and "Portable Computing Language" in i.name]
if len(found) < 2:
    print(json.dumps({"skip": f"PoCL shows {len(found)} device(s) with POCL_DEVICES"}))
    sys.exit(0)
a, b = gw.Device(found[0], backend="opencl"), gw.Device(found[1], backend="opencl")
out = {"specs": [a.spec, b.spec], "exact": {}, "errors": [], "spans": []}
rng = np.random.default_rng(7)
with gw.trace() as t:
    for dtype, n in (("uint8", 1), ("int32", 4097), ("float64", 1 << 16), ("float32", 0)):
        data = rng.integers(0, 250, n).astype(dtype)
        x, y = a.alloc(n, dtype), b.alloc(n, dtype)
        x.copy_from_host(data)
        y.copy_from(x)  # no stream: ordered after x's upload and y's earlier ops
        back = a.alloc(n, dtype)
        back.copy_from(y).wait()
        out["exact"][f"{dtype}[{n}]"] = bool(
            np.array_equal(y.copy_to_host(), data) and np.array_equal(back.copy_to_host(), data)
        )
        for buf in (x, y, back):
            buf.free()
    # Ordering: a peer copy after an async upload on another stream of the source (no stream given: it waits for
    # it), and the source's next blocking write after the peer copy (it waits for the copy to have read).
    n = 1 << 18
    first, second = np.arange(n, dtype=np.float32), -np.arange(n, dtype=np.float32)
    pinned = a.empty_pinned(n, "float32")
    pinned[:] = first
    side = a.create_stream("side")
    x, y = a.alloc(n), b.alloc(n)
    x.copy_from_host_async(pinned, side)
    ev = y.copy_from(x, name="move")
    x.copy_from_host(second)
    ev.wait()
    out["ordered"] = bool(np.array_equal(y.copy_to_host(), first) and np.array_equal(x.copy_to_host(), second))
    # Explicit destination stream; a stream of the source's device is refused.
    s = b.create_stream("peer")
    y.fill_bytes(0).wait()
    y.copy_from(x, stream=s).wait()
    out["on_stream"] = bool(np.array_equal(y.copy_to_host(), second))
    try:
        y.copy_from(x, stream=side)
    except gw.InvalidArgument as exc:
        out["errors"].append(str(exc))
    for dst, src in ((b.alloc(n - 1), x), (b.alloc(n, "int32"), x)):
        try:
            dst.copy_from(src)
        except gw.InvalidArgument as exc:
            out["errors"].append(str(exc))
        dst.free()
    for buf in (x, y):
        buf.free()
for sp in t.spans:
    if sp.kind == "d2d":
        clock = t.devices[sp.device]
        out["spans"].append({"device": clock.key, "bytes": sp.bytes, "name": sp.name, "stream": sp.stream,
                             "route": parse_peer_copy(sp.name), "ns": sp.end_ns - sp.start_ns})
out["labels"] = {f"{t.devices[d].key}/{s}": label for (d, s), label in t.stream_labels.items()}
summary = t.summary()
out["summary"] = summary.to_dict()["cross_device"]
out["text"] = str(summary)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def two_pocl() -> dict:
    """What the two-device script saw, run once in a subprocess with two PoCL devices."""
    pytest.importorskip("pyopencl")
    env = {**os.environ, "POCL_DEVICES": "pthread pthread"}
    env.pop("GPUWB_DEVICE", None)
    done = subprocess.run(
        [sys.executable, "-c", _TWO_POCL], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    return result


def test_pocl_peer_copies_are_byte_exact(two_pocl):
    assert two_pocl["exact"] == {"uint8[1]": True, "int32[4097]": True, "float64[65536]": True, "float32[0]": True}


def test_pocl_peer_copies_keep_order_on_both_buffers(two_pocl):
    assert two_pocl["ordered"] is True
    assert two_pocl["on_stream"] is True


def test_pocl_peer_copy_spans_name_both_devices(two_pocl):
    src, dst = two_pocl["specs"]
    spans = two_pocl["spans"]
    forth = [sp for sp in spans if sp["device"] == dst]
    back = [sp for sp in spans if sp["device"] == src]
    # 4 dtypes forth and back, then the ordered copy and the one on stream "peer" (each direction's own device)
    assert [sp["bytes"] for sp in forth] == [1, 4097 * 4, 8 << 16, 0, 4 << 18, 4 << 18]
    assert [sp["bytes"] for sp in back] == [1, 4097 * 4, 8 << 16, 0]
    assert all(sp["route"] == [src, dst, "staged"] for sp in forth)
    assert all(sp["route"] == [dst, src, "staged"] for sp in back)
    assert forth[4]["name"].startswith("move [") and forth[0]["name"].startswith("p2p 1 B [")
    assert two_pocl["labels"][f"{dst}/{forth[5]['stream']}"] == "peer"
    assert all(sp["ns"] >= 0 for sp in spans)


def test_pocl_peer_copy_mismatches_name_both_buffers(two_pocl):
    src, dst = two_pocl["specs"]
    wrong_stream, shorter, other_dtype = two_pocl["errors"]
    assert f"stream 'side' is on {src}, buffer on {dst}" in wrong_stream
    assert f"buffer of 262143 float32 on {dst} cannot take buffer of 262144 float32 on {src}" in shorter
    assert "same dtype and length" in shorter
    assert f"buffer of 262144 int32 on {dst} cannot take buffer of 262144 float32 on {src}" in other_dtype


def test_pocl_summary_shows_peer_copies(two_pocl):
    src, dst = two_pocl["specs"]
    cross = two_pocl["summary"]
    groups = {(pc["source"], pc["destination"]): pc for pc in cross["peer_copies"]}
    assert set(groups) == {(src, dst), (dst, src)}
    assert groups[src, dst]["count"] == 6 and groups[src, dst]["bytes"] == 1 + 4097 * 4 + (8 << 16) + (8 << 18)
    assert groups[src, dst]["route"] == "staged" and groups[src, dst]["direct_path"] is False
    assert sorted(int(d) for d in cross["busy_ns"]) == [0, 1]  # JSON keys: the trace's device numbers
    assert "across devices" in two_pocl["text"] and f"peer copy {src} → {dst}" in two_pocl["text"]


# ------------------------------------------------------------------------------------------------ cross-device figures
def span(kind: str, device: int, stream: int, start: int, end: int, **extra: object) -> dict:
    return {"kind": kind, "device": device, "stream": stream, "start_ns": start, "end_ns": end, **extra}


def peer(device: int, start: int, end: int, nbytes: int, route: str, src: str = "cuda:1", dst: str = "cuda:0") -> dict:
    name = peer_copy_name("p2p", src, dst, route)
    return span("d2d", device, 0, start, end, bytes=nbytes, name=name)


def test_one_device_without_peer_copies_has_no_cross_device_figures():
    table = table_from_records([span("kernel", 0, 0, 0, 100), span("d2d", 0, 0, 100, 200, name="d2d 1 kB")])
    assert cross_device(table) is None
    summary = summarize(table)
    assert summary.cross_device is None and "across devices" not in str(summary)
    assert "cross_device" not in summary.to_dict()
    assert summarize(table_from_records([])).cross_device is None


def test_cross_device_figures_are_exact():
    # device 0: kernels 0-4 ms and 3-6 ms on two streams (busy 6 ms), a peer copy 6-8 ms from device 1;
    # device 1: kernel 1-3 ms, alloc (host work, not busy) at 9 ms.
    table = table_from_records(
        [
            span("kernel", 0, 1, 0, 4 * MS),
            span("kernel", 0, 2, 3 * MS, 6 * MS),
            peer(0, 6 * MS, 8 * MS, 4_000_000, "direct"),
            span("kernel", 1, 0, 1 * MS, 3 * MS),
            span("alloc", 1, -1, 9 * MS, 9 * MS + 10),
        ]
    )
    cross = cross_device(table)
    assert cross is not None
    assert (cross.window_start_ns, cross.window_end_ns, cross.window_ns) == (0, 8 * MS, 8 * MS)
    assert cross.busy_ns == {0: 8 * MS, 1: 2 * MS}
    assert cross.busy_pct == {0: 100.0, 1: 25.0}
    assert cross.slowest_device == 0 and cross.waited_ns == {0: 0, 1: 5 * MS}
    assert cross.peer_copy_ns == 2 * MS
    (pc,) = cross.peer_copies
    assert (pc.source, pc.destination, pc.route, pc.count, pc.bytes, pc.time_ns) == (
        "cuda:1",
        "cuda:0",
        "direct",
        1,
        4_000_000,
        2 * MS,
    )
    assert pc.bandwidth_gbps == pytest.approx(2.0) and pc.direct_path is True
    # device 0 busy 8 ms against 2 ms: imbalance (both ran kernels)
    assert [a.code for a in cross.advice] == ["device-imbalance"]
    summary = summarize(table)
    assert summary.cross_device == cross
    assert [a.code for a in summary.advice][-1] == "device-imbalance"
    json.dumps(summary.to_dict())
    text = str(summary)
    assert "across devices" in text and "busy % per device    0: 100.0 %, 1: 25.0 %" in text
    assert "slowest device       0; the others waited for it: 1: 5 ms" in text
    assert "peer copy cuda:1 → cuda:0" in text and "2 GB/s (direct)" in text
    assert "gpuworkbench-cross-device" in summary._repr_html_()


def test_cross_device_peer_copies_group_by_pair_and_route_and_clip_to_the_window():
    table = table_from_records(
        [
            peer(0, 0, 1000, 1000, "staged"),
            peer(0, 500, 1500, 1000, "staged"),  # overlaps the first: the union counts 1500 ns, not 2000
            peer(1, 2000, 3000, 3000, "direct", src="cuda:0", dst="cuda:1"),
        ]
    )
    cross = cross_device(table)
    assert [(pc.source, pc.destination, pc.route, pc.count, pc.time_ns) for pc in cross.peer_copies] == [
        ("cuda:1", "cuda:0", "staged", 2, 1500),
        ("cuda:0", "cuda:1", "direct", 1, 1000),
    ]
    assert cross.peer_copies[0].bandwidth_gbps == pytest.approx(2000 / 1500)
    assert cross.peer_copy_ns == 2500
    assert cross.advice == []  # staged where no direct path exists: nothing to advise; no kernels: no imbalance
    clipped = cross_device(table, window=(1000, 2500))
    assert (clipped.window_ns, clipped.peer_copy_ns) == (1500, 1000)
    assert [pc.time_ns for pc in clipped.peer_copies] == [500, 500]
    assert clipped.busy_ns == {0: 500, 1: 500} and clipped.waited_ns == {0: 1000, 1: 0}


def test_a_peer_copy_on_a_one_device_table_still_counts():
    cross = cross_device(table_from_records([peer(0, 0, 100, 100, "staged, direct path unused")]))
    assert cross is not None and cross.busy_ns == {0: 100} and cross.slowest_device == 0
    assert [a.code for a in cross.advice] == ["peer-copy-staged"]


def test_device_imbalance_fires_from_its_threshold():
    def two(busy0: int, busy1: int) -> list[str]:
        table = table_from_records([span("kernel", 0, 0, 0, busy0), span("kernel", 1, 0, 0, busy1)])
        return [a.code for a in summarize(table).advice]

    assert two(10 * MS, 8 * MS) == ["device-imbalance"]  # 1.25 ×, 2 ms apart
    assert two(10 * MS, 8 * MS + 1) == []  # just under 1.25 ×
    assert two(MS, MS // 2) == []  # 2 ×, but less than 1 ms apart
    assert two(4 * MS, 3 * MS) == ["device-imbalance"]  # 1.33 ×, exactly 1 ms apart
    advice = summarize(table_from_records([span("kernel", 0, 0, 0, 3 * MS), span("kernel", 1, 0, 0, 9 * MS)])).advice
    (item,) = advice
    assert item.device == 1 and "device 1 was busy 9 ms, device 0 3 ms (3.00 ×" in item.message
    assert "1.25 ×" in item.message and "6 ms" in item.message  # each would be busy 6 ms spread evenly
    # a device that only received a copy is not compared
    only_copy = [span("kernel", 0, 0, 0, 10 * MS), peer(1, 0, 100, 100, "direct", src="cuda:0", dst="cuda:1")]
    assert [a.code for a in summarize(table_from_records(only_copy)).advice] == []


def test_peer_copy_staged_fires_only_where_a_direct_path_went_unused():
    staged = [
        peer(0, 0, 1000, 1 << 20, "staged, direct path unused"),
        peer(0, 1000, 2000, 1 << 20, "staged, direct path unused"),
        peer(1, 0, 1000, 1 << 20, "staged, direct path unused", src="cuda:0", dst="cuda:1"),
    ]
    advice = summarize(table_from_records(staged)).advice
    assert [(a.code, a.device) for a in advice] == [("peer-copy-staged", 0), ("peer-copy-staged", 1)]
    assert "2 peer copies (2.1 MB) from cuda:1 to cuda:0 went through host memory" in advice[0].message
    for route in ("staged", "direct"):
        quiet = [peer(0, 0, 1000, 1 << 20, route), span("kernel", 1, 0, 0, 1000)]
        assert summarize(table_from_records(quiet)).advice == []


def test_cross_device_figures_from_a_hand_built_trace():
    trace = Trace.from_records(
        [
            span("kernel", 0, 0, 0, 2 * MS),
            peer(1, 2 * MS, 3 * MS, 1_000_000, "direct", src="cuda:0", dst="cuda:1"),
            span("kernel", 1, 0, 3 * MS, 4 * MS + MS // 2),
        ],
        device_names={0: "GPU A", 1: "GPU B"},
    )
    summary = trace.summary()
    cross = summary.cross_device
    assert cross.busy_ns == {0: 2 * MS, 1: 2 * MS + MS // 2}
    assert cross.busy_pct == {0: pytest.approx(100 * 2 / 4.5), 1: pytest.approx(100 * 2.5 / 4.5)}
    assert cross.slowest_device == 1 and cross.waited_ns == {0: 2 * MS + MS // 2, 1: 0}
    assert cross.peer_copies[0].bandwidth_gbps == pytest.approx(1.0)
    assert summary.advice == []  # 2.5 ms against 2 ms: 1.25 × but only 0.5 ms apart


# ------------------------------------------------------------------------------------------------ %gpu links
def test_link_notes(monkeypatch):
    from gpuworkbench.backends import cuda
    from gpuworkbench.backends.base import DeviceInfo
    from gpuworkbench.notebook import devices

    def gpus(n: int) -> list[DeviceInfo]:
        return [DeviceInfo("cuda", i, "GPU", True, 1 << 30) for i in range(n)] + [DeviceInfo("cpu", 0, "CPU", False, 1)]

    links = {(0, 1): "NVLink", (1, 0): "NVLink", (0, 2): "PCIe", (2, 0): "none", (1, 2): "none", (2, 1): "none"}
    monkeypatch.setattr(cuda, "peer_links", lambda count: {k: v for k, v in links.items() if max(k) < count})
    assert devices.link_notes(gpus(1)) == []
    assert devices.link_notes(gpus(0)) == []
    assert devices.link_notes(gpus(3)) == [
        "link cuda:0 ↔ cuda:1: NVLink",
        "link cuda:0 ↔ cuda:2: PCIe (cuda:0 → cuda:2), none (cuda:2 → cuda:0)",
        "link cuda:1 ↔ cuda:2: no peer access: copies between them go through the host",
    ]

    def broken(count: int) -> dict:
        raise RuntimeError("driver says no")

    monkeypatch.setattr(cuda, "peer_links", broken)
    assert devices.link_notes(gpus(2)) == []


def test_gpu_listing_shows_no_links_with_fewer_than_two_gpus(capsys):
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpuworkbench")
    ip.run_line_magic("gpu", "")
    out = capsys.readouterr().out
    cuda_count = sum(1 for info in gw.devices() if info.backend == "cuda")
    assert ("link cuda:" in out) == (cuda_count >= 2)


# ------------------------------------------------------------------------------------------------ CUDA (gpu)
@pytest.mark.gpu
def test_cuda_links_listing_runs():
    (dev,) = cuda_devices(1)
    from gpuworkbench.backends.cuda import peer_links

    count = len(gw.backends.get("cuda").devices())
    links = peer_links(count)
    assert set(links) == {(a, b) for a in range(count) for b in range(count) if a != b}
    assert all(v == "none" or v in ("NVLink", "PCIe") or v.startswith("peer") for v in links.values())


@pytest.mark.gpu
@pytest.mark.parametrize("nbytes", [4, 4097 * 4, 64 << 20])
def test_cuda_peer_copy_both_ways(nbytes):
    a, b = cuda_devices(2)
    n = nbytes // 4
    data = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    route = b.backend_device.peer_route(a.backend_device)
    with a.alloc(n) as x, b.alloc(n) as y, a.alloc(n) as back, gw.trace() as t:
        x.copy_from_host(data)
        y.copy_from(x)
        back.copy_from(y)
        x.copy_from_host(np.zeros(n, np.float32))  # waits for the copy that read x
        assert np.array_equal(y.copy_to_host(), data) and np.array_equal(back.copy_to_host(), data)
    peers = [(sp, parse_peer_copy(sp.name)) for sp in t.spans if sp.kind == "d2d"]
    assert [p[1][:2] for p in peers] == [(a.spec, b.spec), (b.spec, a.spec)]
    expected = "direct" if route.direct else "staged, direct path unused" if route.possible else "staged"
    assert peers[0][1][2] == expected
    assert all(sp.bytes == nbytes and sp.end_ns >= sp.start_ns for sp, _ in peers)
    assert t.devices[peers[0][0].device].key == b.spec
    cross = t.summary().cross_device
    assert {(pc.source, pc.destination) for pc in cross.peer_copies} == {(a.spec, b.spec), (b.spec, a.spec)}


@pytest.mark.gpu
def test_cuda_peer_copy_on_a_stream_waits_for_nothing_else():
    a, b = cuda_devices(2)
    n = 1 << 20
    data = np.arange(n, dtype=np.float32)
    s = b.create_stream("peer")
    with a.alloc(n) as x, b.alloc(n) as y:
        x.copy_from_host(data)
        y.copy_from(x, stream=s).wait()
        assert np.array_equal(y.copy_to_host(), data)
    s.close()


def test_peer_copies_are_timed_by_events_in_a_cupti_trace():
    """CUPTI reports a peer copy as a MEMCPY2 record, a kind a trace does not enable: such an op is timed by events
    (measured on two H200s: as a CUPTI op it got no span); other copies of a CUPTI device stay CUPTI's."""
    from gpuworkbench.trace.spans import peer_copy_name

    t = gw.Trace()
    t._cupti_flags = [True]
    peer = peer_copy_name("p2p 4 B", "cuda:0", "cuda:1", "direct")
    assert not t.uses_cupti(0, "d2d", 4, peer)
    assert t.uses_cupti(0, "d2d", 4, "d2d 4 B") and t.uses_cupti(0, "h2d", 4, peer)
    assert not t.uses_cupti(0, "d2d", 0, "d2d 0 B")
