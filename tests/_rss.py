"""Peak memory in tests.

``ru_maxrss`` is not a measure of a child process: Linux keeps the high-water mark
across fork and exec, so a subprocess started by a pytest process that once held 2 GB
reports at least 2 GB, and a difference of two readings in it is then 0 whatever the
child does. ``VmHWM`` (``/proc/self/status``) belongs to the process image: fresh after
exec. In-process measurements use :class:`memgas_gpu.bench.timing.PeakMemory`, which
resets it.
"""
from __future__ import annotations

#: source of ``hwm_bytes()`` for the scripts the tests run in a subprocess
HWM = '''
def hwm_bytes():
    """The peak resident set of this process image (bytes)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource, sys
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024
'''
