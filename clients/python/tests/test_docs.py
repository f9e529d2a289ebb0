"""docs/agents-python.md's walkthrough, run as written: its ```sh walkthrough blocks in
order in one bash, with its ```python walkthrough blocks saved as walkthrough.py, against
the built binary (its fixed port 8080 becomes a free one)."""

import os
import re
import subprocess
import tempfile
import time
import unittest

import harness

DOC = os.path.join(harness.REPO, "docs", "agents-python.md")


def blocks(doc: str, lang: str):
    return re.findall(r"```" + lang + r" walkthrough\n(.*?)```", doc, re.S)


class WalkthroughTest(unittest.TestCase):
    def test_the_walkthrough_runs(self):
        with open(DOC, encoding="utf-8") as f:
            doc = f.read()
        sh, py = blocks(doc, "sh"), blocks(doc, "python")
        self.assertGreaterEqual(len(sh), 3)
        self.assertGreaterEqual(len(py), 4)
        with tempfile.TemporaryDirectory() as d:
            os.symlink(harness.binary(), os.path.join(d, "airlock"))
            os.symlink(os.path.join(harness.REPO, "clients"), os.path.join(d, "clients"))
            listen = f"127.0.0.1:{harness.free_port()}"
            with open(os.path.join(d, "walkthrough.py"), "w") as f:
                f.write("\n".join(py).replace("127.0.0.1:8080", listen))
            script = "\n".join(sh).replace("127.0.0.1:8080", listen)
            script = ("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + script + "\nwait\n")
            env = {k: v for k, v in os.environ.items() if not k.startswith("AIRLOCK_")}
            env["AIRLOCK_LISTEN"] = listen  # serve's default is 127.0.0.1:8080
            start = time.monotonic()
            p = subprocess.run(["bash", "-c", script], cwd=d, env=env, capture_output=True, text=True, timeout=120)
            logs = ""
            if os.path.exists(os.path.join(d, "airlock.log")):
                with open(os.path.join(d, "airlock.log")) as f:
                    logs = f.read()
            out = p.stdout + p.stderr
            self.assertEqual(p.returncode, 0, f"the walkthrough failed after {time.monotonic() - start:.1f}s:\n{out}\n{logs}")
        lines = p.stdout.splitlines()
        self.assertIn("killed (exit 137)", lines, out)
        self.assertIn("claimed, reclaimed: True verdict: reconcile", lines, out)
        self.assertIn("reconciled share-draft-01 -> confirmed", lines, out)
        self.assertTrue(any(l.startswith("already confirmed: doc://") for l in lines), out)
        self.assertIn("completed", lines, out)
        # One document from the walkthrough, one per run of the example agent: 3, after a crash each.
        self.assertEqual(lines[-1].strip(), "3", out)
        self.assertIn("1", [l.strip() for l in lines], "the restarted example agent reconciled once")


class StepAgentShownTest(unittest.TestCase):
    def test_the_doc_shows_the_step_agent_as_it_is_tested(self):
        with open(DOC, encoding="utf-8") as f:
            doc = f.read()
        with open(os.path.join(harness.PYROOT, "examples", "onboard.py"), encoding="utf-8") as f:
            src = f.read()
        self.assertIn("```python\n" + src + "```", doc, "docs/agents-python.md does not show examples/onboard.py as it is")
        self.assertLess(src.count("\n"), 40, "the step agent is under 40 lines")


if __name__ == "__main__":
    unittest.main()
