"""Run a user's script as ``python SCRIPT ARGS`` does, then let Horovod's timeline writer finish.

Horovod 0.28.1 writes its timeline from a queue in a thread of its own and drops what is still queued
when it shuts down at exit, so a plain run's timeline can lack the last step on a loaded host. This
wrapper changes nothing the script does: it runs it as ``__main__`` and, once it has returned, waits
until the timeline file has not grown for half a second (at most 10 s) before the interpreter exits.

    python plain_script.py SCRIPT [ARGS...]
"""

import os
import runpy
import sys

from memdiag.format.rundir import wait_for_timeline_writer

if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        if os.environ.get("HOROVOD_TIMELINE"):
            wait_for_timeline_writer(os.environ["HOROVOD_TIMELINE"])
