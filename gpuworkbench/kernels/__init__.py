"""Kernels: raw source compiled per backend (``Kernel``), and ``elementwise``: one expression for every backend."""

from __future__ import annotations

from ..backends.base import BufferArg
from .elementwise import ElementwiseKernel, elementwise
from .raw import Kernel

__all__ = ["BufferArg", "ElementwiseKernel", "Kernel", "elementwise"]
