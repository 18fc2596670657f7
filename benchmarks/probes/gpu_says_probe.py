"""What this GPU machine offers for counters, NVTX and launch shapes: a probe, printed as facts (GPU machine only).

Each NVTX case runs in a fresh process: NVTX binds its injection at a process's first NVTX call, so cases cannot
share one. ``python benchmarks/probes/gpu_says_probe.py`` prints every case; ``--case NAME`` runs one (the children).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

SCRIPT = os.path.abspath(__file__)


def loaded_cuptis() -> list[str]:
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "libcupti" in line})


def nvtx_case(set_inside: str) -> None:
    """Trace torch's and nvtx's ranges; ``set_inside``: a path put in NVTX_INJECTION64_PATH after importing torch."""
    import torch

    if set_inside:
        os.environ["NVTX_INJECTION64_PATH"] = set_inside
    import nvtx

    import gpuworkbench as gw
    from gpuworkbench.trace.spans import KIND_CODE

    a = torch.randn(512, 512, device="cuda")
    (a @ a).sum().item()
    with gw.trace(others=True) as t:
        torch.cuda.nvtx.range_push("outer")
        with nvtx.annotate("inner"):
            (a @ a).sum().item()
        torch.cuda.nvtx.range_pop()
        with torch.autograd.profiler.emit_nvtx():
            (a @ a).relu().sum().item()
        torch.cuda.synchronize()
    table = t.table()
    ranges = table["name"][table["kind"] == KIND_CODE["range"]].tolist()
    print(
        json.dumps(
            {
                "env": os.environ.get("NVTX_INJECTION64_PATH", ""),
                "ranges": ranges[:12],
                "n_ranges": len(ranges),
                "cuptis": loaded_cuptis(),
                "warnings": list(t.stats.warnings)[:4],
            }
        )
    )


def spy_markers(*fields: str) -> list[tuple]:
    """A list that every NVTX marker record decoded from now on is appended to, as a tuple of ``fields``."""
    from gpuworkbench.trace.cupti import decode

    raw: list[tuple] = []
    take = decode.RecordDecoder.take_extras

    def spy(self):  # noqa: ANN001, ANN202
        out = take(self)
        marks = out.get("marker")
        if marks is not None:
            raw.extend(zip(*(marks[f].tolist() for f in fields)))
        return out

    decode.RecordDecoder.take_extras = spy
    return raw


def marker_case(warm: bool) -> None:
    """Every raw NVTX marker CUPTI hands over, per trace, for torch's, nvtx's and emit_nvtx's ranges."""
    import torch

    os.environ["NVTX_INJECTION64_PATH"] = loaded_wheel_cupti()
    import nvtx

    import gpuworkbench as gw
    from gpuworkbench.trace.spans import KIND_CODE

    raw = spy_markers("flags", "id", "thread_id", "name", "domain")
    a = torch.randn(512, 512, device="cuda")
    if warm:
        torch.cuda.nvtx.range_push("warm")
        torch.cuda.nvtx.range_pop()
        with nvtx.annotate("warm"):
            pass
    for round_ in range(2):
        raw.clear()
        with gw.trace(others=True) as t:
            for i in range(2):
                torch.cuda.nvtx.range_push(f"outer{i}")
                with nvtx.annotate(f"inner{i}"):
                    (a @ a).sum()
                torch.cuda.nvtx.range_pop()
                torch.cuda.nvtx.mark(f"mark{i}")
            torch.cuda.synchronize()
        table = t.table()
        ranges = table["name"][table["kind"] == KIND_CODE["range"]].tolist()
        print(json.dumps({"warm": warm, "round": round_, "ranges": ranges, "raw": raw[:24]}))


def nvtx_variant(case: str) -> None:
    """One way of making NVTX ranges, in a fresh process pointed at the wheel's libcupti: raw markers and spans."""
    os.environ["NVTX_INJECTION64_PATH"] = loaded_wheel_cupti()
    import torch

    raw = spy_markers("flags", "id", "name", "domain")
    import gpuworkbench as gw
    from gpuworkbench.trace.spans import KIND_CODE

    a = torch.randn(256, 256, device="cuda")
    with gw.trace(others=True) as t:
        if case == "torch_nested":
            torch.cuda.nvtx.range_push("outer")
            torch.cuda.nvtx.range_push("inner")
            (a @ a).sum()
            torch.cuda.nvtx.range_pop()
            torch.cuda.nvtx.range_pop()
        elif case == "torch_start_end":
            r = torch.cuda.nvtx.range_start("startend")
            (a @ a).sum()
            torch.cuda.nvtx.range_end(r)
        elif case.startswith("nvtx_"):
            import nvtx

            if case == "nvtx_annotate":
                with nvtx.annotate("annotated"):
                    (a @ a).sum()
            elif case == "nvtx_domain":
                with nvtx.annotate("in_domain", domain="mydomain"):
                    (a @ a).sum()
            elif case == "nvtx_push":
                nvtx.push_range("pushed")
                (a @ a).sum()
                nvtx.pop_range()
            elif case == "nvtx_two_instances":  # nvtx's copy of NVTX injected first, then torch's nested push/pop
                with nvtx.annotate("first", domain="mydomain"):
                    pass
                torch.cuda.nvtx.range_push("outer")
                torch.cuda.nvtx.range_push("inner")
                (a @ a).sum()
                torch.cuda.nvtx.range_pop()
                torch.cuda.nvtx.range_pop()
                with nvtx.annotate("last", domain="mydomain"):
                    pass
            elif case == "nvtx_mix":
                torch.cuda.nvtx.range_push("outer")
                with nvtx.annotate("inner"):
                    (a @ a).sum()
                torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
    table = t.table()
    ranges = table["name"][table["kind"] == KIND_CODE["range"]].tolist()
    print(json.dumps({"case": case, "ranges": ranges, "raw": raw[:12]}))


def loaded_wheel_cupti() -> str:
    from cuda import pathfinder

    return str(pathfinder.load_nvidia_dynamic_lib("cupti").abs_path)


def facts() -> None:
    from cupti import cupti

    cupti.get_timestamp()
    print("cupti-python loaded:", loaded_cuptis())
    try:
        from cuda import pathfinder

        print("pathfinder cupti:", pathfinder.load_nvidia_dynamic_lib("cupti").abs_path)
    except Exception as exc:  # noqa: BLE001
        print("pathfinder:", repr(exc))
    print("on disk:", sorted(glob.glob("/usr/local/cuda*/**/libcupti.so*", recursive=True))[:6])
    print(
        "site libcupti:",
        sorted(
            glob.glob(os.path.join(sys.prefix, "lib/python3*/site-packages/nvidia/**/libcupti.so*"), recursive=True)
        ),
    )
    for name in ("activity_kernel10_dtype", "activity_kernel9_dtype", "activity_marker2_dtype"):
        dt = getattr(cupti, name, None)
        print(name, None if dt is None else [(n, dt.fields[n][1]) for n in dt.names])
    print(
        "pm/profiler names:",
        [
            n
            for n in dir(cupti)
            if any(w in n.lower() for w in ("pm_", "pmsampling", "sampling", "profiler", "range_profiler"))
        ][:60],
    )
    print("cuda-bindings cupti modules:", [m for m in sys.modules if "cupti" in m])
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        u = pynvml.nvmlDeviceGetUtilizationRates(h)
        print(
            "nvml",
            pynvml.__file__,
            pynvml.nvmlSystemGetDriverVersion(),
            "util",
            u.gpu,
            u.memory,
            "power mW",
            pynvml.nvmlDeviceGetPowerUsage(h),
            "sm clock",
            pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        )
        for fname in (
            "NVML_FI_DEV_PCIE_TX_BYTES",
            "NVML_FI_DEV_PCIE_RX_BYTES",
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
            "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX",
        ):
            fid = getattr(pynvml, fname, None)
            if fid is None:
                print(fname, "absent")
                continue
            vals = pynvml.nvmlDeviceGetFieldValues(h, [fid])
            v = vals[0]
            print(fname, fid, "ret", v.nvmlReturn, "type", v.valueType, "value", v.value.ullVal, "ts", v.timestamp)
        try:
            samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
            print(
                "nvmlDeviceGetSamples GPU util:",
                samples[0],
                len(samples[1]),
                [(s.timeStamp, s.sampleValue.uiVal) for s in samples[1][:5]],
            )
        except Exception as exc:  # noqa: BLE001
            print("samples:", repr(exc))
        for fn in ("nvmlDeviceGetPcieThroughput",):
            try:
                print(fn, getattr(pynvml, fn)(h, pynvml.NVML_PCIE_UTIL_TX_BYTES))
            except Exception as exc:  # noqa: BLE001
                print(fn, repr(exc))
        gpm = [n for n in dir(pynvml) if "Gpm" in n][:20]
        print("gpm api:", gpm)
        try:
            print("gpm supported:", pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        except Exception as exc:  # noqa: BLE001
            print("gpm support:", repr(exc))
    except Exception as exc:  # noqa: BLE001
        print("nvml:", repr(exc))
    print(
        "nvidia-smi dmon:",
        subprocess.run(["nvidia-smi", "dmon", "-c", "2", "-s", "putm"], capture_output=True, text=True).stdout[-600:],
    )
    cs = shutil.which("compute-sanitizer") or (glob.glob("/usr/local/cuda*/bin/compute-sanitizer") or [""])[0]
    print("compute-sanitizer:", cs)
    # torch.profiler's kernel args (launch shapes)
    import torch
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(2048, 2048, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        (a @ a).softmax(1).sum().item()
    prof.export_chrome_trace("/tmp/k.json")
    events = json.load(open("/tmp/k.json"))["traceEvents"]
    for e in [e for e in events if e.get("cat") == "kernel"][:3]:
        print("kineto kernel:", e["name"][:60], e.get("args"))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--variants":
        for case in ("torch_nested", "nvtx_two_instances", "nvtx_domain", "nvtx_mix"):
            r = subprocess.run([sys.executable, SCRIPT, "--variant", case], capture_output=True, text=True, timeout=90)
            print(r.stdout.strip()[-700:] or r.stderr.strip()[-700:])
        sys.exit(0)
    if len(sys.argv) > 2 and sys.argv[1] == "--variant":
        nvtx_variant(sys.argv[2])
        sys.exit(0)
    if len(sys.argv) > 2 and sys.argv[1] == "--markers":
        marker_case(sys.argv[2] == "warm")
        sys.exit(0)
    if len(sys.argv) > 2 and sys.argv[1] == "--case":
        nvtx_case(sys.argv[2] if sys.argv[2] != "-" else "")
        sys.exit(0)
    facts()
    from cupti import cupti

    cupti.get_timestamp()
    wheel = loaded_cuptis()[0] if loaded_cuptis() else ""
    system = (sorted(glob.glob("/usr/local/cuda*/targets/x86_64-linux/lib/libcupti.so.20*")) or [""])[0]
    cases = [
        ("none", {}, "-"),
        ("env system before start", {"NVTX_INJECTION64_PATH": system}, "-"),
        ("env wheel before start", {"NVTX_INJECTION64_PATH": wheel}, "-"),
        ("wheel set after torch import", {}, wheel),
    ]
    for label, env, inside in cases:
        e = dict(os.environ, **env)
        e.pop("NVTX_INJECTION64_PATH", None) if not env else None
        r = subprocess.run(
            [sys.executable, SCRIPT, "--case", inside], capture_output=True, text=True, env=e, timeout=120
        )
        print(
            f"NVTX case [{label}]: rc {r.returncode}",
            r.stdout.strip()[-900:],
            r.stderr.strip()[-400:] if r.returncode else "",
        )
