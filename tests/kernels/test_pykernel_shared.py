"""Tests of cooperative ``@gw.kernel`` functions: shared arrays, barriers and block indices on every backend.

A block-sum reduction and the library's tiled matmul (awkward sizes, bounds checks in the kernel) run on cpu (NumPy,
vectorised and block by block), opencl (PoCL), webgpu (lavapipe) and cuda (marked gpu), checked against NumPy; the
generated sources; barriers every thread reaches (test_pykernel.py refuses the others); errors for blocks that do
not fit.
"""

import os
import tempfile

import numpy as np
import pytest
from support import WITH_WEBGPU, open_device

import gpuworkbench as gw
from gpuworkbench.library import _kernels
from gpuworkbench.library._kernels import BLOCK, TILE  # 16 × 16 threads, 4 × 4 values each

matmul_tiled = _kernels.matmul_tiled()  # float32's

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="gpuwb-xdg-"))  # quiets Mesa's loader
every_backend = pytest.mark.parametrize("device", WITH_WEBGPU, indirect=True)
GROUP = 256


@gw.kernel(block=GROUP)
def block_sum(i: gw.index, out: gw.f32[:], x: gw.f32[:], n: gw.i32):
    """out[b] = the sum of x over block b's 256 elements (a tree in shared memory)."""
    part = gw.shared(GROUP, gw.f32)
    lid = gw.local_id(0)
    part[lid] = x[i] if i < n else 0.0
    gw.barrier()
    for k in range(7, -1, -1):  # strides 128, 64, ..., 1: log2(256) halvings
        if lid < 1 << k:
            part[lid] += part[lid + (1 << k)]
        gw.barrier()
    if lid == 0:
        out[gw.group_id(0)] = part[0]


@gw.kernel(block=8)
def reverse_prefix(i: gw.index, out: gw.i32[:], x: gw.i32[:]):
    """Each thread sums its block's first lid + 1 elements (a range per thread: the CPU goes block by block), then
    reads the sum its mirror thread wrote before the barrier."""
    sums = gw.shared(8, "int32")  # a NumPy name works as the type too
    lid = gw.local_id(0)
    total = 0
    for k in range(lid + 1):
        total += x[i - lid + k]
    sums[lid] = total
    gw.barrier()
    out[i] = sums[gw.group_size(0) - 1 - lid] + 1000 * gw.num_groups(0)


@gw.kernel(block=(4, 2))
def places(x: gw.index, y: gw.index, out: gw.i32[:, :]):
    out[y, x] = (
        gw.local_id(0)
        + 10 * gw.local_id(1)
        + 100 * gw.group_id(0)
        + 1000 * gw.group_id(1)
        + 10_000 * gw.group_size(0)
        + 100_000 * gw.group_size(1)
        + 1_000_000 * gw.num_groups(0)
        + 10_000_000 * gw.num_groups(1)
    )


@gw.kernel(block=2)
def tiny_blocks(i: gw.index, out: gw.i32[:]):
    out[i] = gw.group_id(0) * gw.group_size(0) + gw.local_id(0) - i  # zero everywhere


def upload(device: gw.Device, host: np.ndarray) -> gw.Buffer:
    buf = device.alloc(host.size, host.dtype)
    buf.copy_from_host(np.ascontiguousarray(host).reshape(-1))
    return buf


def round_up(v: int, to: int) -> int:
    return -(-v // to) * to


def run_matmul(device: gw.Device, m: int, n: int, k: int, explicit: bool = False) -> None:
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = rng.integers(-4, 5, (m, k)).astype(np.float32)
    b = rng.integers(-4, 5, (k, n)).astype(np.float32)
    with upload(device, a) as ba, upload(device, b) as bb, device.alloc(m * n) as bc:
        if explicit:
            grid = (-(-n // BLOCK), -(-m // BLOCK))  # x (columns) first: a block per BLOCK × BLOCK tile of c
            matmul_tiled(grid, (TILE, TILE), (bc, ba, bb, m, n, k)).wait()
        else:
            shape = (round_up(m, BLOCK) // 4, round_up(n, BLOCK) // 4)  # a thread per 4 × 4 values of c
            matmul_tiled.launch(shape, bc, ba, bb, m, n, k).wait()
        assert np.array_equal(bc.copy_to_host().reshape(m, n), a @ b), (m, n, k)


# ------------------------------------------------------------------------------------------------------ every backend
@every_backend
@pytest.mark.parametrize("n", [1, 255, 256, 1000, 4097])
def test_block_sum_reduction(device, n):
    x = np.random.default_rng(n).integers(-9, 10, n).astype(np.float32)
    groups = -(-n // GROUP)
    with upload(device, x) as bx, device.alloc(groups) as out:
        block_sum.launch(groups * GROUP, out, bx, n).wait()
        padded = np.pad(x, (0, groups * GROUP - n))
        assert np.array_equal(out.copy_to_host(), padded.reshape(groups, GROUP).sum(axis=1))
        assert out.copy_to_host().sum() == x.sum()


@every_backend
@pytest.mark.parametrize("mnk", [(1, 1, 1), (17, 17, 17), (33, 29, 31), (16, 16, 16), (5, 40, 3), (1, 33, 17)])
def test_tiled_matmul_awkward_sizes(device, mnk):
    run_matmul(device, *mnk)


@every_backend
def test_tiled_matmul_with_an_explicit_grid(device):
    run_matmul(device, 33, 29, 20, explicit=True)


@every_backend
def test_shared_array_read_after_a_barrier_with_per_thread_loops(device):
    x = np.arange(32, dtype=np.int32) ** 2 % 7
    with upload(device, x) as bx, device.alloc(32, "int32") as out:
        reverse_prefix.launch(32, out, bx).wait()
        expected = np.cumsum(x.reshape(4, 8), axis=1)[:, ::-1].reshape(-1) + 4000
        assert np.array_equal(out.copy_to_host(), expected)


@every_backend
def test_block_indices_in_two_dimensions(device):
    with device.alloc(6 * 12, "int32") as out:
        places.launch((6, 12), out).wait()  # 6 rows (3 blocks of 2), 12 columns (3 blocks of 4)
        yy, xx = np.indices((6, 12))
        expected = (xx % 4) + 10 * (yy % 2) + 100 * (xx // 4) + 1000 * (yy // 2) + 40_000 + 200_000
        expected += 3_000_000 + 30_000_000
        assert np.array_equal(out.copy_to_host().reshape(6, 12), expected)


@every_backend
def test_more_blocks_than_one_grid_dimension_holds(device):
    n = 2 * 70_000  # 70 000 blocks: past WebGPU's 65 535 per dimension, the grid spills into y
    with device.alloc(n, "int32") as out:
        tiny_blocks.launch(n, out).wait()
        assert not out.copy_to_host().any()


# ------------------------------------------------------------------------------------------------ CPU strategies
def test_cpu_strategies():
    assert block_sum.cpu_strategy == "vectorised" and matmul_tiled.cpu_strategy == "vectorised"
    assert reverse_prefix.cpu_strategy == "loop" and "block by block" in reverse_prefix.source("numpy")
    assert "yield  # gw.barrier()" in reverse_prefix.source("numpy")
    assert block_sum.cooperative and matmul_tiled.cooperative and places.cooperative


def test_cpu_block_by_block_with_a_return_inside_a_loop(cpu):
    @gw.kernel(block=4)
    def first_big(i: gw.index, out: gw.i32[:], x: gw.i32[:], w: gw.i32):
        seen = gw.shared(4, gw.i32)
        lid = gw.local_id(0)
        seen[lid] = x[i]
        gw.barrier()
        out[i] = -1
        for k in range(w):  # after the last barrier: returning here is every thread's own business
            if seen[(lid + k) % 4] > 5:
                out[i] = k
                return

    assert first_big.cpu_strategy == "loop"
    x = np.array([1, 9, 2, 3, 0, 0, 0, 0], np.int32)
    with upload(cpu, x) as bx, cpu.alloc(8, "int32") as out:
        first_big.launch(8, out, bx, 4).wait()
        assert out.copy_to_host().tolist() == [1, 0, 3, 2, -1, -1, -1, -1]


# ------------------------------------------------------------------------------------------------------- sources
def test_generated_sources_name_each_backends_words():
    cuda, opencl, wgsl = (matmul_tiled.source(lang) for lang in ("cuda", "opencl", "wgsl"))
    assert "__shared__ float ta[1024];" in cuda and "__syncthreads();" in cuda and "threadIdx.x" in cuda
    assert "__local float ta[1024];" in opencl and "barrier(CLK_LOCAL_MEM_FENCE" in opencl
    assert "get_local_id(0)" in opencl
    assert "var<workgroup> ta: array<f32, 1024>;" in wgsl and "workgroupBarrier();" in wgsl
    assert "@workgroup_size(16, 16)" in wgsl and "@builtin(local_invocation_id)" in wgsl
    for text in (cuda, opencl, wgsl):  # whole blocks run: no early return of threads past the launch's edge
        assert ">= gw_nx" not in text and ">= gw_args.gw_nx" not in text


def test_shared_arrays_and_builtins_refuse_to_run_as_python():
    for call in (lambda: gw.local_id(0), gw.barrier, lambda: gw.shared(4, gw.f32), lambda: gw.num_groups(0)):
        with pytest.raises(gw.InvalidArgument, match="inside a @gw.kernel body"):
            call()


@pytest.mark.gpu
def test_cuda_compiles_and_runs_the_cooperative_kernels():
    device = open_device("cuda")
    assert "__syncthreads" in block_sum.source("cuda")
    block_sum.compile(device)  # NVRTC builds the generated source
    run_matmul(device, 33, 29, 31)
    x = np.arange(1000, dtype=np.float32) % 13
    with upload(device, x) as bx, device.alloc(4) as out:
        block_sum.launch(1024, out, bx, 1000).wait()
        assert np.array_equal(out.copy_to_host(), np.pad(x, (0, 24)).reshape(4, 256).sum(axis=1))


# ------------------------------------------------------------------------------------------------------ block errors
@gw.kernel(block=64)
def lane(i: gw.index, out: gw.i32[:]):
    out[i] = gw.local_id(0)


@gw.kernel
def huge_shared(i: gw.index, out: gw.f32[:]):
    big = gw.shared(1 << 22, gw.f32)  # 16 MiB: more than any device's shared memory
    big[gw.local_id(0)] = 1.0
    gw.barrier()
    out[i] = big[0]


@every_backend
def test_block_errors(device):
    limits = device.backend_device.kernel_limits()
    with device.alloc(1 << 14, "int32") as out, device.alloc(1 << 14) as outf:
        with pytest.raises(gw.InvalidArgument, match=r"launch shape 100 must be a multiple of the block 64"):
            lane.launch(100, out)
        with pytest.raises(gw.InvalidArgument, match=r"multiple of the block 16 × 16; launch \(48, 32\)"):
            matmul_tiled.launch((33, 29), out, out, out, 1, 1, 1)
        too_many = limits.threads * 2
        with pytest.raises(gw.InvalidArgument, match=f"{too_many} threads; .* at most {limits.threads}"):
            lane.launch(too_many, out, block=too_many)
        with pytest.raises(gw.InvalidArgument, match="at most"):
            lane(1, too_many, (out,))
        with pytest.raises(gw.InvalidArgument, match="shared memory per block"):
            huge_shared.launch(256, outf)
        lane.launch(128, out).wait()  # a good launch still works after the refused ones
        assert np.array_equal(out.copy_to_host()[:128], np.arange(128) % 64)


# ---------------------------------------------------------------------------------------------- barriers accepted
@gw.kernel(block=4)
def uniform(i: gw.index, out: gw.f32[:], n: gw.i32, flag: gw.i32):
    s = gw.shared(4, gw.f32)
    s[gw.local_id(0)] = 1.0
    if flag > 0:  # a parameter: the same in every thread
        gw.barrier()
    if gw.group_id(0) == 0:  # the same in every thread of a block
        gw.barrier()
    for _k in range(n):  # a range from parameters
        gw.barrier()
    if i >= n:  # a return after the last barrier
        return
    out[i] = s[3 - gw.local_id(0)] + gw.num_groups(0)


@every_backend
def test_barriers_every_thread_reaches_are_accepted(device):
    with device.alloc(8) as out:
        out.fill_bytes(0).wait()
        uniform.launch(8, out, 6, 1).wait()
        assert out.copy_to_host().tolist() == [3.0] * 6 + [0.0] * 2


# ------------------------------------------------------------------------------------------------------- min_blocks
@gw.kernel(block=64, min_blocks=4)
def bounded_lane(i: gw.index, out: gw.i32[:]):
    out[i] = gw.local_id(0)


def test_min_blocks_bounds_cuda_source_alone():
    """``min_blocks`` becomes CUDA's ``__launch_bounds__`` for the kernel's block (not HIP's, whose second number
    counts something else); OpenCL's source is as without it."""
    cuda = bounded_lane.source("cuda")
    assert "#define GW_BOUNDS __launch_bounds__(64, 4)" in cuda and "void GW_BOUNDS bounded_lane(" in cuda
    assert "__HIP__" in cuda and "launch_bounds" not in lane.source("cuda")
    assert "launch_bounds" not in bounded_lane.source("opencl") and "GW_BOUNDS" not in bounded_lane.source("opencl")
    with pytest.raises(gw.InvalidArgument, match="min_blocks must be a positive int, not 0"):
        gw.kernel(min_blocks=0)(lane.__wrapped__)


@every_backend
def test_min_blocks_refuses_a_larger_block(device):
    with device.alloc(256, "int32") as out:
        with pytest.raises(gw.InvalidArgument, match=r"128 threads; the kernel is built for blocks of at most 64"):
            bounded_lane.launch(256, out, block=128)
        bounded_lane.launch(128, out, block=32).wait()  # a smaller block is within the bound
        bounded_lane.launch(256, out).wait()
        assert np.array_equal(out.copy_to_host(), np.arange(256) % 64)


@pytest.mark.gpu
def test_cuda_builds_and_runs_a_bounded_kernel():
    device = open_device("cuda")
    with device.alloc(256, "int32") as out:
        bounded_lane.launch(256, out).wait()
        assert np.array_equal(out.copy_to_host(), np.arange(256) % 64)
