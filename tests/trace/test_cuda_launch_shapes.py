"""How each kernel was launched, on a real GPU: the registers, shared memory and theoretical occupancy a trace reports
against CUDA's own numbers (a CuPy RawKernel's attributes, the driver's occupancy calculator, the device's attributes),
and PyTorch's kernels' launch shapes against those torch.profiler records for the same kernels.

Marked ``gpu``; skipped cleanly where CuPy, PyTorch, cupti-python or a GPU is missing.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from support import cupy_with_cupti

import gpuworkbench as gw
from gpuworkbench.trace.device_limits import DeviceLimits
from gpuworkbench.trace.occupancy import occupancy
from gpuworkbench.trace.spans import KIND_CODE, unpack_dim3

pytestmark = [pytest.mark.gpu, pytest.mark.cupti]

#: 516 floats of static shared memory (2064 B), dynamic shared memory used where ``dynamic`` > 0.
SOURCE = r"""
extern "C" __global__ void staged(const float* x, float* y, int n, int dynamic) {
    __shared__ float tile[516];
    extern __shared__ float extra[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int t = threadIdx.x % 516;
    tile[t] = i < n ? x[i] : 0.0f;
    if (dynamic > 0 && threadIdx.x == 0) extra[0] = tile[0];
    __syncthreads();
    if (i < n) y[i] = tile[t] * 2.0f + (dynamic > 0 ? extra[0] * 0.0f : 0.0f);
}
"""
N = 1 << 16
#: (threads per block, dynamic shared bytes) of each launch.
LAUNCHES = [(64, 0), (256, 0), (1024, 0), (256, 40_000)]


@pytest.fixture(scope="module")
def cp():
    return cupy_with_cupti()


def kernel_rows(table: dict, word: str) -> np.ndarray:
    rows = np.flatnonzero((table["kind"] == KIND_CODE["kernel"]) & np.array([word in str(n) for n in table["name"]]))
    return rows[np.argsort(table["start_ns"][rows], kind="stable")]


def test_the_devices_limits_are_its_cuda_attributes(cp):
    with gw.trace(others=True) as t:
        (cp.arange(16) + 1).sum()
        cp.cuda.Device().synchronize()
    t.table()  # the records are decoded (and their devices met) once read
    (limits,) = [c.limits for c in t.devices.values() if c.key.startswith("cuda")]
    a = cp.cuda.Device(0).attributes
    assert limits == DeviceLimits.from_properties(cp.cuda.runtime.getDeviceProperties(0))
    assert (limits.sms, limits.warp_size) == (a["MultiProcessorCount"], a["WarpSize"])
    assert (limits.threads_per_sm, limits.blocks_per_sm) == (
        a["MaxThreadsPerMultiProcessor"],
        a["MaxBlocksPerMultiprocessor"],
    )
    assert (limits.registers_per_sm, limits.registers_per_block) == (
        a["MaxRegistersPerMultiprocessor"],
        a["MaxRegistersPerBlock"],
    )
    assert (limits.shared_per_sm, limits.shared_per_block, limits.reserved_shared) == (
        a["MaxSharedMemoryPerMultiprocessor"],
        a["MaxSharedMemoryPerBlockOptin"],
        a["ReservedSharedMemoryPerBlock"],
    )


def test_a_cupy_raw_kernels_registers_shared_memory_and_occupancy_are_cudas(cp):
    kernel = cp.RawKernel(SOURCE, "staged")
    x, y = cp.arange(N, dtype=cp.float32), cp.empty(N, cp.float32)
    kernel((1,), (32,), (x, y, np.int32(N), np.int32(0)))  # compiled and loaded outside the trace
    cp.cuda.Device().synchronize()
    with gw.trace(others=True) as t:
        for block, dynamic in LAUNCHES:
            kernel((N // block,), (block,), (x, y, np.int32(N), np.int32(dynamic)), shared_mem=dynamic)
        cp.cuda.Device().synchronize()
    table = t.table()
    rows = kernel_rows(table, "staged")
    assert rows.size == len(LAUNCHES)
    attributes = kernel.attributes
    limits = t.devices[int(table["device"][rows[0]])].limits
    assert limits is not None
    for (block, dynamic), i in zip(LAUNCHES, rows.tolist()):
        assert (unpack_dim3(table["grid"][i]), unpack_dim3(table["block"][i])) == ((N // block, 1, 1), (block, 1, 1))
        registers, shared = int(table["registers"][i]), int(table["shared_bytes"][i])
        # CUPTI gives the registers the launch was given: on an H200 16 where the compiler's count is 11
        assert registers >= attributes["num_regs"]
        assert shared == attributes["shared_size_bytes"] + dynamic == 2064 + dynamic
        ours = occupancy(np.array([block]), np.array([registers]), np.array([shared]), limits)
        cudas = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, block, dynamic)
        assert int(ours.blocks[0]) == cudas, (block, dynamic)
        assert ours.pct[0] == pytest.approx(100 * cudas * -(-block // 32) / limits.warps_per_sm)
    (row,) = [r for r in t.statistics().kernels.to_dict("records") if "staged" in r["name"]]
    first = occupancy(np.array([64]), np.array([int(table["registers"][rows[0]])]), np.array([2064]), limits).pct[0]
    assert (row["block"], row["occupancy_pct"]) == ("64,1,1", pytest.approx(first))  # ties: the first shape seen


def test_our_kernels_registers_and_shared_memory_agree_from_cupti_and_from_the_driver(cp):
    dev = gw.Device("cuda:0")
    k = dev.compile(SOURCE, "staged")
    x, y = dev.alloc(N, "float32"), dev.alloc(N, "float32")
    driver = cp.RawKernel(SOURCE, "staged").attributes  # the same NVRTC compile, asked of the driver
    found = {}
    for source in ("auto", "events"):
        with gw.trace(source=source) as t:
            k((N // 256,), (256,), [x, y, np.int32(N), np.int32(0)])
            dev.synchronize()
        table = t.table()
        (i,) = kernel_rows(table, "staged").tolist()
        found[t.devices[0].source] = (int(table["registers"][i]), int(table["shared_bytes"][i]))
        assert t.devices[0].limits == DeviceLimits.from_properties(cp.cuda.runtime.getDeviceProperties(0))
        assert unpack_dim3(table["block"][i]) == (256, 1, 1) and unpack_dim3(table["grid"][i]) == (N // 256, 1, 1)
    # without CUPTI the column holds the compiler's count (cuFuncGetAttribute); CUPTI's is what the launch was given
    assert found["events"] == (driver["num_regs"], 2064)
    assert found["cupti"][1] == 2064 and found["cupti"][0] >= driver["num_regs"]
    assert k.resources() == (driver["num_regs"], 2064)


def kineto_shapes(doc: dict) -> dict[str, set]:
    """Per kernel name, the (grid, block, registers, shared memory) of its launches in a torch.profiler trace."""
    shapes: dict[str, set] = defaultdict(set)
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            a = e["args"]
            shapes[e["name"]].add((tuple(a["grid"]), tuple(a["block"]), a["registers per thread"], a["shared memory"]))
    return shapes


def table_shapes(table: dict) -> dict[str, set]:
    shapes: dict[str, set] = defaultdict(set)
    for i in np.flatnonzero(table["kind"] == KIND_CODE["kernel"]).tolist():
        shape = (unpack_dim3(table["grid"][i]), unpack_dim3(table["block"][i]))
        shapes[str(table["name"][i])].add((*shape, int(table["registers"][i]), int(table["shared_bytes"][i])))
    return shapes


def test_torch_kernels_launch_shapes_are_those_torch_profiler_records(cp, tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    a, b = torch.randn(2048, 2048, device="cuda"), torch.randn(2048, 2048, device="cuda")

    def work() -> None:
        (a @ b).relu_().sum()
        torch.cuda.synchronize()

    work()  # cuBLAS picks its kernels, modules load
    with gw.trace(others=True) as t:
        work()
    assert t.wait_pending(30) and t.stats.lost == 0
    ours = table_shapes(t.table())  # every record in before the profiler takes CUPTI
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
    path = tmp_path / "torch.json"
    prof.export_chrome_trace(str(path))
    theirs = kineto_shapes(json.loads(path.read_text()))
    shared = set(ours) & set(theirs)
    assert shared, (sorted(ours), sorted(theirs))
    assert {name: ours[name] for name in shared} == {name: theirs[name] for name in shared}
    loaded = gw.load_trace(path)  # the same file read back: the same shapes, and the device's limits from Kineto's
    assert table_shapes(loaded.table()) == {name: theirs[name] for name in theirs}
    (limits,) = [c.limits for c in t.devices.values() if c.key.startswith("cuda")]
    assert loaded.devices[0].limits == limits
