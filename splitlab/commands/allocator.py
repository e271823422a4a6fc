"""Keep freed host memory in the process: CPU inference without a page fault per activation.

glibc serves large allocations with ``mmap`` and returns freed heap to the system, so each new
activation of a ViT forward on CPU is fresh memory that faults in page by page (4 KiB each) on its
first write. Measured on this project's 2-core CPU, ViT-B/16-224 at batch 8: timm's forward took
60-110 thousand minor page faults and 1690 ms per batch, SPLIT's 18-41 thousand and 1180 ms; with
the freed memory kept, none once the first batches have run, 1530 and 1105 ms; at batch 32 both paths
ran 12-14% faster (docs/performance.md). Serving
setups do the same with jemalloc or tcmalloc; this is the one-line version for glibc, applied by
``splitlab predict`` and ``splitlab bench`` (both paths of a comparison run in the one process, so
both get it). A process of your own gets it from the environment, before Python starts:
``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647``.
"""

from __future__ import annotations

import ctypes
import platform

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
KEEP_UP_TO = 2**31 - 1  # bytes of freed memory at the top of the heap kept, not given back (an int's most)


def keep_freed_memory() -> bool:
    """Serve every allocation from the heap and keep what is freed (glibc's ``mallopt``), so that
    a forward's activations reuse the previous batch's memory. The process keeps its peak heap, as
    PyTorch's CUDA caching allocator keeps its peak on the GPU.

    Returns:
        whether the setting took (False off glibc, e.g. macOS or musl: nothing is changed there).
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success, 0 on error
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_UP_TO))


def minor_page_faults() -> int | None:
    """Minor page faults of this process so far (first writes to fresh memory, among others); None
    where the system does not count them (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
