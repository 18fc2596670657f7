"""The notebook side: the ``%gpu`` and ``%%gpu`` magics, the traces a kernel captured, quick benchmarks, the hooks run
around each cell, and the kernel end of the JupyterLab panel.

``%load_ext gpuworkbench`` registers them. Nothing here is imported by the rest of the package.
"""
