"""Run a script with a SIGKILL at one step boundary: AGENT_CRASH_AT=POINT:EFFECT_ID kills the
process the first time AgentRun reaches POINT (before_perform, after_perform, after_confirm)
of that step; AGENT_CRASH_MARK is a file written first, so a restarted process runs on."""

import os
import runpy
import signal
import sys

import airlock


def _hook(point, call):
    mark = os.environ.get("AGENT_CRASH_MARK", "")
    if os.environ.get("AGENT_CRASH_AT") == f"{point}:{call.effect_id}" and not os.path.exists(mark):
        open(mark, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


airlock.AgentRun._hook = staticmethod(_hook)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
