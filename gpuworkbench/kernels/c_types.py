"""The C name of each NumPy element type in CUDA C and OpenCL C (kernel sources written for either dialect)."""

from __future__ import annotations

C_TYPES = {
    "cuda": {
        "float32": "float",
        "float64": "double",
        "int32": "int",
        "uint32": "unsigned int",
        "int64": "long long",
        "uint64": "unsigned long long",
        "int16": "short",
        "uint16": "unsigned short",
        "int8": "signed char",
        "uint8": "unsigned char",
    },
    "opencl": {
        "float32": "float",
        "float64": "double",
        "int32": "int",
        "uint32": "uint",
        "int64": "long",
        "uint64": "ulong",
        "int16": "short",
        "uint16": "ushort",
        "int8": "char",
        "uint8": "uchar",
    },
}
