"""Where ``gw.crossover`` keeps its results: one JSON file in the user's cache directory (``GPUWB_CACHE_DIR``, else
platformdirs' user cache directory, else ``~/.cache/gpuworkbench``), per device (backend and name) and library
version, each op under its name for float32 and "name:dtype" for other dtypes; and reading them back, for a result
or for a trace's advice (``cached_crossovers``, every dtype: their kernels carry the type in their names)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..device import Device
from ..pykernel.ktypes import NUMPY_TYPES, kernel_type
from ..trace.analysis import CrossoverPoint
from .crossover_ops import OPS, check_dtype, check_ops, op_for
from .crossover_result import CrossoverResult

CACHE_ENV = "GPUWB_CACHE_DIR"
CACHE_FILE = "crossover.json"
FORMAT = 1


def cache_dir() -> Path:
    """Where results are cached: ``$GPUWB_CACHE_DIR``, else platformdirs' user cache dir, else ~/.cache."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs
    except ImportError:
        return Path.home() / ".cache" / "gpuworkbench"
    return Path(platformdirs.user_cache_dir("gpuworkbench", appauthor=False))


def cache_path() -> Path:
    """The cache file (it may not exist yet)."""
    return cache_dir() / CACHE_FILE


_VERSION: str | None = None


def library_version() -> str:
    """The package version and a hash of ``gw.library``'s source (its ops and kernels, not the crossover code): a change
    to a kernel makes old results stale."""
    global _VERSION
    if _VERSION is None:
        try:
            from importlib.metadata import version

            package = version("gpuworkbench")
        except Exception:  # noqa: BLE001  (running from a checkout that is not installed)
            package = "0"
        digest = hashlib.sha1()
        for path in sorted(Path(__file__).parent.glob("*.py")):
            if not path.name.startswith("crossover"):
                digest.update(path.read_bytes())
        _VERSION = f"{package}+{digest.hexdigest()[:12]}"
    return _VERSION


def device_key(backend: str, name: str, version: str | None = None) -> str:
    """The cache key of a device's results: backend, device name and library version."""
    return f"{backend}|{name}|{version or library_version()}"


def read_cache(path: Path) -> dict[str, Any]:
    """The cache file's contents; an empty cache where it is missing, unreadable or of another format."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"format": FORMAT, "devices": {}}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("devices"), dict):
        return {"format": FORMAT, "devices": {}}
    return data


def _shared_cache(path: Path) -> dict[str, Any]:
    """``read_cache(path)``, parsed once per version of the file (its inode, mtime and size), for readers that
    change nothing in it: every traced cell's summary looks its devices up."""
    try:
        st = path.stat()
    except OSError:
        return read_cache(path)
    stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
    kept = _SHARED.get(path)
    if kept is None or kept[0] != stamp:
        kept = _SHARED[path] = (stamp, read_cache(path))
    return kept[1]


_SHARED: dict[Path, tuple[tuple[int, int, int], dict[str, Any]]] = {}


def _write_cache(path: Path, key: str, entry: dict[str, Any]) -> None:
    """Merge ``entry`` into the file under ``key`` (read again first: another process may have written) and drop
    the same device's results of other library versions. Written to a temporary file, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = read_cache(path)
    device = key.rsplit("|", 1)[0] + "|"
    devices = {k: v for k, v in data["devices"].items() if not k.startswith(device) or k == key}
    devices[key] = entry
    data["devices"] = devices
    fd, tmp = tempfile.mkstemp(prefix=".crossover-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def op_key(op: str, dtype: str = "float32") -> str:
    """Where an op's runs on inputs of ``dtype`` are cached: its name for float32, "name:dtype" otherwise."""
    return op if dtype == "float32" else f"{op}:{dtype}"


def sizes_key(sizes: Sequence[int] | None) -> str:
    """How a run's sizes are keyed in the cache: "default", or the sizes asked for."""
    return "default" if sizes is None else ",".join(map(str, sizes))


def store(path: Path, key: str, dev: Device, measured: dict[str, dict[str, Any]]) -> None:
    """Add the runs just ``measured`` (per op) to the device's entry under ``key``."""
    entry = read_cache(path)["devices"].get(key) or {"device": dev.spec, "name": dev.name, "ops": {}}
    for name, found in measured.items():
        entry["ops"].setdefault(name, {})[sizes_key(found["sizes"])] = found
    _write_cache(path, key, entry)


def cached_result(
    device: Device | str, ops: str | Sequence[str] | None = None, dtype: Any = "float32"
) -> CrossoverResult | None:
    """The cached measurements of ``device`` on inputs of ``dtype`` (the default sizes' where several were
    measured, else the widest range), without measuring anything; None when none is cached for this library
    version."""
    dev = Device(device) if isinstance(device, str) else device
    names = check_ops(ops)
    return _cached(dev.backend_kind.value, dev.name, dev.spec, names, check_dtype(names, dtype))


def _cached(backend: str, name: str, spec: str, ops: list[str], dtype: str = "float32") -> CrossoverResult | None:
    entry = _shared_cache(cache_path())["devices"].get(device_key(backend, name))
    if not entry:
        return None
    result = CrossoverResult(
        device=spec,
        device_name=name,
        backend=backend,
        version=library_version(),
        rows=[],
        units={},
        kernels={},
        cache_file=str(cache_path()),
        dtype=dtype,
    )
    for op in ops:
        runs = entry.get("ops", {}).get(op_key(op, dtype))
        if not runs:
            continue
        best = runs.get("default") or max(
            runs.values(), key=lambda run: max((r["size"] for r in run["rows"]), default=0)
        )
        result.units[op], result.from_cache[op] = OPS[op].unit, True
        result.kernels[op] = op_for(op, dtype).kernel
        result.rows += [dict(r, op=op) for r in best["rows"]]
    return result if result.rows else None


def cached_crossovers(trace: Any) -> dict[int, dict[str, CrossoverPoint]]:
    """Per device number of ``trace`` (anything with ``.devices``: number → ``key`` "backend:N" and ``name``), the
    cached crossover of every library kernel: what ``summarize(table, crossover=...)`` takes. Reads the cache file."""
    found = {}
    for number, clock in getattr(trace, "devices", {}).items():
        backend = str(clock.key).split(":", 1)[0]
        entry = _shared_cache(cache_path())["devices"].get(device_key(backend, clock.name)) or {}
        dtypes = {key.partition(":")[2] or "float32" for key in entry.get("ops", {})}
        points: dict[str, CrossoverPoint] = {}
        for dtype in sorted(dtypes, key=lambda d: d != "float32"):
            if kernel_type(dtype) is None:
                continue  # a dtype this process cannot name (bfloat16 without ml_dtypes)
            result = _cached(backend, clock.name, clock.key, [op for op in OPS if dtype in _names(op)], dtype)
            if result is not None:
                points.update(result.points())
        if points:
            found[int(number)] = points
    return found


def _names(op: str) -> set[str]:
    return {NUMPY_TYPES[t] for t in OPS[op].takes}
