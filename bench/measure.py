"""Run a bench module's ``__main__`` in this process and append this process's peak RSS to its JSON line.

    python -m bench.measure bench.lake_build LAKE OUT_DIR
"""

import json
import resource
import runpy
import sys
from contextlib import redirect_stdout
from io import StringIO

def peak_rss_kb() -> int:
    """Peak resident memory of this program.

    VmHWM belongs to the address space, which exec replaces; ru_maxrss would also count the
    parent's memory at fork time (Linux keeps it across exec), so it is only the fallback.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


if __name__ == "__main__":
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    buf = StringIO()
    with redirect_stdout(buf):
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    lines = buf.getvalue().strip().splitlines()
    data = json.loads(lines[-1]) if lines else {}
    data["peak_rss_kb"] = peak_rss_kb()
    print(json.dumps(data))
