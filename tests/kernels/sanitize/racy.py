"""Kernels for the compute-sanitizer tests: a shared-memory exchange with and without its barrier.

``python tests/sanitize/racy.py racy|clean`` launches one of them on cuda:0 and checks nothing itself: run under
``compute-sanitizer --tool racecheck``, the racy one must be reported and the clean one must not."""

import sys

import numpy as np

import gpuworkbench as gw

GROUP = 128


@gw.kernel(block=GROUP)
def rotate_racy(i: gw.index, out: gw.f32[:], x: gw.f32[:]):
    """Each thread writes its value to shared memory and reads its neighbour's, with no barrier between: a race."""
    tile = gw.shared(GROUP, gw.f32)
    lid = gw.local_id(0)
    tile[lid] = x[i]
    out[i] = tile[(lid + 1) % GROUP]


@gw.kernel(block=GROUP)
def rotate(i: gw.index, out: gw.f32[:], x: gw.f32[:]):
    """The same exchange with the barrier that makes it correct."""
    tile = gw.shared(GROUP, gw.f32)
    lid = gw.local_id(0)
    tile[lid] = x[i]
    gw.barrier()
    out[i] = tile[(lid + 1) % GROUP]


def main(which: str) -> None:
    dev = gw.Device("cuda:0")
    kernel = {"racy": rotate_racy, "clean": rotate}[which]
    x = np.arange(4 * GROUP, dtype=np.float32)
    with dev.alloc(x.size) as bx, dev.alloc(x.size) as out:
        bx.copy_from_host(x)
        kernel.launch(x.size, out, bx).wait()
        got = out.copy_to_host()
    if which == "clean":
        assert np.array_equal(got, np.roll(x.reshape(4, GROUP), -1, axis=1).ravel())
    print("launched", which)


if __name__ == "__main__":
    main(sys.argv[1])
