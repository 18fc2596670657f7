"""Where the fields we read sit in CUPTI's activity records, and the kind codes and enum tables decoding needs.

cupti-python's NumPy dtypes give the offsets where present; the offsets of cupti.h are the fallback and a cross-check
(``RecordTables.layout_notes`` says where they differ). The tables are made once per cupti module and shared by every
source: making them took ~0.3 ms of a trace's start.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# CUpti_ActivityMemcpyKind names -> our span kinds; anything else is "other_copy".
COPY_KIND_NAMES: dict[str, str] = {
    "HTOD": "h2d",
    "HTOA": "h2d",
    "DTOH": "d2h",
    "ATOH": "d2h",
    "DTOD": "d2d",
    "ATOA": "d2d",
    "ATOD": "d2d",
    "DTOA": "d2d",
    "PTOP": "d2d",
}

# Record layouts: the fields we read, as (byte offset, size) in the C structs of cupti.h (CUpti_ActivityKernel4..10,
# CUpti_ActivityMemcpy6, CUpti_ActivityMemset4, CUpti_ActivityExternalCorrelation). cupti-python's dtypes, where
# present, override them; these are the fallback and a cross-check.
BUILTIN_FIELDS: dict[str, dict[str, tuple[int, int]]] = {
    "kernel": {
        "start": (16, 8),
        "end": (24, 8),
        "device_id": (40, 4),
        "stream_id": (48, 4),
        "correlation_id": (92, 4),
        "name": (104, 8),
        "grid_x": (52, 4),
        "grid_y": (56, 4),
        "grid_z": (60, 4),
        "block_x": (64, 4),
        "block_y": (68, 4),
        "block_z": (72, 4),
        "registers_per_thread": (6, 2),
        "static_shared_memory": (76, 4),
        "dynamic_shared_memory": (80, 4),
    },
    "memcpy": {
        "copy_kind": (4, 1),
        "src_kind": (5, 1),
        "dst_kind": (6, 1),
        "bytes": (8, 8),
        "start": (16, 8),
        "end": (24, 8),
        "device_id": (32, 4),
        "stream_id": (40, 4),
        "correlation_id": (44, 4),
        "runtime_correlation_id": (48, 4),
    },
    "memset": {
        "bytes": (8, 8),
        "start": (16, 8),
        "end": (24, 8),
        "device_id": (32, 4),
        "stream_id": (40, 4),
        "correlation_id": (44, 4),
    },
    "ext": {"external_kind": (4, 4), "external_id": (8, 8), "correlation_id": (16, 4)},
    "api": {"cbid": (4, 4), "start": (8, 8), "end": (16, 8), "thread_id": (28, 4), "correlation_id": (32, 4)},
    "memory": {
        "memory_operation_type": (4, 4),
        "memory_kind": (8, 4),
        "correlation_id": (12, 4),
        "address": (16, 8),
        "bytes": (24, 8),
        "timestamp": (32, 8),
        "device_id": (52, 4),
        "stream_id": (60, 4),
    },
    "marker": {
        "flags": (4, 4),
        "timestamp": (8, 8),
        "id": (16, 4),
        "thread_id": (28, 4),
        "name": (40, 8),
        "domain": (48, 8),
    },
}
# cupti-python dtype names per struct (newest first).
DTYPE_NAMES: dict[str, tuple[str, ...]] = {
    "kernel": ("activity_kernel10_dtype", "activity_kernel9_dtype"),
    "memcpy": ("activity_memcpy6_dtype", "activity_memcpy5_dtype"),
    "memset": ("activity_memset4_dtype",),
    "ext": ("activity_external_correlation_dtype",),
    "api": ("activity_api_dtype",),
    "memory": ("activity_memory4_dtype",),
    "marker": ("activity_marker2_dtype",),
}
BUILTIN_SIZES: dict[str, int] = {"ext": 24, "api": 40, "memory": 128, "marker": 56}

#: The tables made per cupti module (kept with it: ids are reused).
_TABLES: dict[int, tuple[Any, RecordTables]] = {}


def layout(cupti: Any) -> tuple[dict[str, dict[str, tuple[int, int]]], dict[str, int], list[str]]:
    """Field (offset, size) per struct and struct sizes, from cupti-python's dtypes where it has them; plus notes."""
    fields: dict[str, dict[str, tuple[int, int]]] = {}
    sizes: dict[str, int] = dict(BUILTIN_SIZES)
    notes: list[str] = []
    for struct, names in DTYPE_NAMES.items():
        dtype = next((getattr(cupti, n) for n in names if getattr(cupti, n, None) is not None), None)
        if dtype is not None:
            sizes[struct] = (int(dtype.itemsize) + 7) // 8 * 8
        builtin = BUILTIN_FIELDS.get(struct, {})
        chosen: dict[str, tuple[int, int]] = {}
        for field, default in builtin.items():
            camel = field.split("_")[0] + "".join(p.title() for p in field.split("_")[1:])
            entry = None
            for name in (field, camel):
                if dtype is not None and dtype.fields and name in dtype.fields:
                    entry = dtype.fields[name]
                    break
            if entry is not None and entry[0].itemsize in (1, 2, 4, 8) and entry[0].kind in "iub":
                chosen[field] = (int(entry[1]), int(entry[0].itemsize))
                if chosen[field] != default:
                    notes.append(f"{struct}.{field} at {chosen[field]} per cupti-python, {default} per cupti.h")
            else:
                chosen[field] = default
                notes.append(f"{struct}.{field}: built-in offset {default}")
        if builtin:
            fields[struct] = chosen
    return fields, sizes, notes


class RecordTables:
    """Kind codes, enum lookup tables and record layouts from one cupti module (``of``: made once, then shared)."""

    def __init__(self, cupti: Any) -> None:
        kind = cupti.ActivityKind
        self.k_kernels = (int(kind.CONCURRENT_KERNEL), int(kind.KERNEL))
        self.k_memcpy = int(kind.MEMCPY)
        self.k_memset = int(kind.MEMSET)
        self.k_ext = int(kind.EXTERNAL_CORRELATION)
        self.k_api = (int(kind.DRIVER), int(kind.RUNTIME))
        self.k_memory = int(kind.MEMORY2) if hasattr(kind, "MEMORY2") else -1
        self.k_marker = int(kind.MARKER) if hasattr(kind, "MARKER") else -1
        self.api_names: dict[int, dict[int, str]] = {
            domain: {int(m): m.name for m in enum_cls}
            for domain, enum_cls in ((0, cupti.driver_api_trace_cbid), (1, cupti.runtime_api_trace_cbid))
        }
        self.ext_kind = int(cupti.ExternalCorrelationKind.CUSTOM0)
        self.copy_names = np.full(256, "other_copy", dtype=object)
        for member in cupti.ActivityMemcpyKind:
            if 0 <= int(member) < 256:
                self.copy_names[int(member)] = COPY_KIND_NAMES.get(member.name, "other_copy")
        self.pinned_of = np.full(256, -1, dtype=np.int64)
        self.pinned_of[int(cupti.ActivityMemoryKind.PINNED)] = 1
        self.pinned_of[int(cupti.ActivityMemoryKind.PAGEABLE)] = 0
        self.host_src = np.array([int(cupti.ActivityMemcpyKind.HTOD), int(cupti.ActivityMemcpyKind.HTOA)])
        self.host_dst = np.array([int(cupti.ActivityMemcpyKind.DTOH), int(cupti.ActivityMemcpyKind.ATOH)])
        self.fields, self.sizes, self.layout_notes = layout(cupti)
        #: CUPTI_ERROR_MAX_LIMIT_REACHED: how CUPTI's own walk says it reached a buffer's end.
        self.end_status = int(cupti.Result.ERROR_MAX_LIMIT_REACHED)

    @classmethod
    def of(cls, cupti: Any, walker: Any = None) -> RecordTables:
        """The tables of ``cupti``, made on first use; then the walker (a ``RecordWalker``) learns the record sizes
        they predict and how CUPTI's walk ends."""
        cached = _TABLES.get(id(cupti))
        if cached is not None and cached[0] is cupti:
            return cached[1]
        tables = cls(cupti)
        if walker is not None:
            tables.teach(walker)
        _TABLES[id(cupti)] = (cupti, tables)
        return tables

    def teach(self, walker: Any) -> None:
        """Give ``walker`` the end status of CUPTI's walk and the record sizes the dtypes predict per kind code."""
        walker.end_status = self.end_status
        for struct, codes in (
            ("kernel", self.k_kernels),
            ("memcpy", (self.k_memcpy,)),
            ("memset", (self.k_memset,)),
            ("ext", (self.k_ext,)),
            ("api", self.k_api),
            ("memory", (self.k_memory,)),
            ("marker", (self.k_marker,)),
        ):
            if struct in self.sizes:
                for code in codes:
                    walker.expected_bytes[code] = self.sizes[struct]
