"""The restart test (killed at each step, resumed, nothing done twice) for the Python weekly-report agent (examples/weekly_report.py):
it SIGKILLs itself before creating the document, after, and before confirming the
receipt; started again, it reclaims the run once the lease lapses, reconciles, and
finishes. Exactly one document exists each time, and the checkpoints are 1 to 4."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest
from concurrent.futures import ThreadPoolExecutor

import harness

AGENT = os.path.join(harness.PYROOT, "examples", "weekly_report.py")
LEASE = 1  # seconds: a restarted agent reclaims its run soon after a crash


def run_agent(server, run_id, docs, crash_at=""):
    env = dict(os.environ, AIRLOCK_API_KEY=server.keys["runs"], AGENT_CRASH_AT=crash_at)
    p = subprocess.run([sys.executable, AGENT, "--airlock", server.url, "--run-id", run_id, "--docs", docs,
                        "--lease", str(LEASE), "--wait", "30"], env=env, capture_output=True, text=True, timeout=90)
    lines = []
    for line in p.stdout.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            pass
    return p, lines


class AgentBase:
    server: harness.Server

    def docs_of(self, docs, run_id):
        out = []
        for fn in os.listdir(docs):
            if fn.endswith(".json"):
                with open(os.path.join(docs, fn)) as f:
                    if json.load(f)["run_id"] == run_id:
                        out.append(fn)
        return out

    def test_crash_and_resume(self):
        docs = tempfile.mkdtemp(prefix="airlock-py-docs-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", docs]))
        cases = (("", None), ("before_create", []), ("after_create", 1), ("before_receipt", 1))

        def scenario(crash_at):
            # The crash points run at once, each on its own run: the lease waits overlap.
            run_id = harness.unique("report")
            first = run_agent(self.server, run_id, docs, crash_at)[0] if crash_at else None
            return run_id, first, run_agent(self.server, run_id, docs)

        with ThreadPoolExecutor(len(cases)) as pool:
            results = list(pool.map(scenario, [c for c, _ in cases]))
        for (crash_at, want_found), (run_id, first, (p, lines)) in zip(cases, results):
            with self.subTest(crash_at=crash_at or "none"):
                if crash_at:
                    self.assertEqual(first.returncode, -signal.SIGKILL, first.stdout + first.stderr)
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
                self.assertEqual(len(self.docs_of(docs, run_id)), 1, "exactly one document for the run")
                created = [l for l in lines if l["msg"] == "document created"]
                recon = [l for l in lines if l["msg"] == "reconciled"]
                if want_found is None:
                    self.assertEqual(len(created), 1)
                    self.assertEqual(recon, [])
                elif want_found == []:
                    self.assertEqual([(r["found"], r["status"]) for r in recon], [([], "cleared")])
                    self.assertEqual(len(created), 1, "nothing was found: created once, after the restart")
                else:
                    self.assertEqual([(len(r["found"]), r["status"]) for r in recon], [(1, "confirmed")])
                    self.assertEqual(created, [], "the document exists: not created again")
                events, _ = self.client().events(run_id, limit=1000)
                saved = [e.detail.get("checkpoint_version") for e in events if e.kind == "ledger_saved"]
                self.assertEqual(saved, [1, 2, 3, 4])
                self.assertEqual(self.client().run(run_id).state, "completed")

    def test_two_candidates_stop_for_a_person(self):
        docs = tempfile.mkdtemp(prefix="airlock-py-docs-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", docs]))
        run_id = harness.unique("report")
        p, _ = run_agent(self.server, run_id, docs, "after_create")
        self.assertEqual(p.returncode, -signal.SIGKILL)
        with open(os.path.join(docs, "doc-planted.json"), "w") as f:
            json.dump({"id": "doc-planted", "run_id": run_id, "title": "t", "body": "b"}, f)
        p, lines = run_agent(self.server, run_id, docs)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertEqual([r["status"] for r in lines if r["msg"] == "reconciled"], ["unknown"])
        self.assertEqual(len(self.docs_of(docs, run_id)), 2, "no third document")

    def client(self):
        import airlock
        return airlock.Client(self.server.url, self.server.keys["runs"])


harness.per_backend(AgentBase, globals())

if __name__ == "__main__":
    unittest.main()
