#!/usr/bin/env python3
"""The weekly-report agent of airlock's work-ledger seed, in Python, on the low-level
calls (plan, confirm, reconcile, save_ledger by hand; examples/onboard.py is the step API,
and examples/agent the Go agent on it). It can be killed at any moment and started again
without repeating its one external effect or starting over.

Steps: sources_collected -> create_internal_draft (creates a document in a file-backed
document system: the one external effect, effect id share-draft-01) -> compare_figures
-> done. After every step it saves the ledger with checkpoint_version + 1; around the
document it plans first and confirms the document's id after; on restart, the resume
verdict tells it to search the document system by run id for an effect that was planned
but never confirmed.

    AIRLOCK_API_KEY=... python3 weekly_report.py --run-id report-2026w48 --docs ./docs --lease 5

Exit status: 0 done (or already completed), 2 stopped for a person, 3 waiting for an
approval, 1 any other error. AGENT_CRASH_AT=before_create, after_create or
before_receipt makes it SIGKILL itself at that point (the restart test).
"""

import argparse
import datetime
import json
import os
import secrets
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # run from the repository

import airlock  # noqa: E402
from airlock import Ledger, Step, hash_input  # noqa: E402

EFFECT_ID = "share-draft-01"
ACTION = "create_internal_draft"  # an action type of airlock's policy (connector: worker)
TARGET = "internal-docs"
FIGURES = [["revenue", "1,204,000 JPY"], ["tickets_closed", "311"], ["median_first_response", "42 min"]]


class Stop(Exception):
    """A person must decide: exit 2."""


class Wait(Exception):
    """A person's approval is pending: exit 3."""


def log(msg, **kw):
    print(json.dumps({"time": datetime.datetime.now(datetime.timezone.utc).isoformat(), "msg": msg, **kw}), flush=True)


def crash_point(point):
    # SIGKILL runs no cleanup and flushes nothing, as a power cut or an OOM kill would.
    if os.environ.get("AGENT_CRASH_AT") == point:
        os.kill(os.getpid(), signal.SIGKILL)


class Docs:
    """The document system: a directory of {id, run_id, title, body} JSON files."""

    def __init__(self, root):
        self.root = root

    def create(self, run_id, title, body):
        doc = {"id": "doc-" + secrets.token_hex(6), "run_id": run_id, "title": title, "body": body}
        tmp = os.path.join(self.root, "." + doc["id"])
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.rename(tmp, os.path.join(self.root, doc["id"] + ".json"))
        return doc

    def get(self, receipt):
        with open(os.path.join(self.root, receipt.replace("doc://", "") + ".json")) as f:
            return json.load(f)

    def search_by_run_id(self, run_id):
        out = []
        for fn in sorted(os.listdir(self.root)):
            if fn.endswith(".json"):
                with open(os.path.join(self.root, fn)) as f:
                    d = json.load(f)
                if d.get("run_id") == run_id:
                    out.append(d)
        return out


class Agent:
    def __init__(self, client, key, docs, lease, wait):
        self.c, self.key, self.docs, self.lease, self.wait = client, key, docs, lease, wait
        self.claim = None

    def claim_when_free(self):
        """Claim the run; if a live lease is held (this agent before a crash), sleep until
        it lapses and claim again: polling would count every try as a duplicate."""
        deadline = time.monotonic() + self.wait
        while True:
            cl = self.c.claim(self.key, {"report": "weekly", "run_id": self.key}, trigger_source="weekly-report-agent",
                              lease_seconds=self.lease)
            if cl.claimed or cl.state != airlock.STATE_PROCESSING:
                return cl
            pause = 0.1
            if cl.lease_expires_at:
                pause = max((cl.lease_expires_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds() + 0.1,
                            0.05)
            if time.monotonic() + pause > deadline:
                raise Stop(f"another process holds the run's lease (waited {self.wait}s)")
            log("lease held elsewhere; waiting", run_id=self.key, retry_in_ms=int(pause * 1000))
            time.sleep(pause)

    def run(self):
        cl = self.claim_when_free()
        if not cl.claimed:
            if cl.state == airlock.STATE_COMPLETED:
                log("already completed", run_id=self.key, result=cl.result)
                return
            r = self.c.resume(self.key)
            if r.verdict == airlock.VERDICT_WAIT:
                raise Wait("; ".join(r.reasons))
            raise Stop(f"the run is {cl.state}: " + "; ".join(r.reasons))
        self.claim = cl
        log("claimed", run_id=self.key, reclaimed=cl.reclaimed, version=cl.version)
        with self.c.keep_lease(cl, self.lease) as lease:
            self.lease_keeper = lease
            ledger = self.resume()
            while ledger.next_allowed_action != "done":
                lease.check()
                ledger = self.step(ledger)
        receipt = ledger.evidence_of("create_internal_draft")
        t = self.c.transition(self.key, cl.lease_owner, cl.version, airlock.STATE_COMPLETED,
                              result={"document": receipt})
        log("run completed", run_id=self.key, state=t.state, document=receipt)

    def resume(self):
        while True:
            r = self.c.resume(self.key)
            log("resume", run_id=self.key, verdict=r.verdict, next_allowed_action=r.next_allowed_action,
                checkpoint_version=r.checkpoint_version, reasons=r.reasons)
            if r.verdict == airlock.VERDICT_RECONCILE:
                for item in r.reconcile:
                    self.reconcile(item)
                continue
            if r.verdict == airlock.VERDICT_WAIT:
                raise Wait("; ".join(r.reasons))
            if r.verdict != airlock.VERDICT_CONTINUE:
                raise Stop("; ".join(r.reasons))
            if r.checkpoint_version == 0:  # a new run: its first ledger, before anything is done
                return self.save(Ledger(
                    goal="Draft the weekly report and share it internally once approved",
                    invariants=["Never send customer names to external services",
                                "Do not issue a share link before approval"],
                    pending=["sources_collected", "create_internal_draft", "compare_figures"],
                    next_allowed_action="sources_collected"))
            ledger = self.c.ledger(self.key)
            if (ledger.checkpoint_version, ledger.next_allowed_action) != (r.checkpoint_version, r.next_allowed_action):
                raise Stop("the ledger moved while resuming")
            return ledger

    def reconcile(self, item):
        """Search the document system for an effect planned but never confirmed."""
        if item.action != ACTION:
            raise Stop(f"no search is known for action {item.action} (effect {item.effect_id})")
        try:
            found = ["doc://" + d["id"] for d in self.docs.search_by_run_id(item.run_id)]
            status = self.c.reconcile(self.key, item.effect_id, self.claim.lease_owner, found)
        except OSError as e:  # a failed search proves nothing: a person decides
            log("search failed", run_id=item.run_id, err=str(e))
            found, status = [], self.c.reconcile(self.key, item.effect_id, self.claim.lease_owner, undetermined=True)
        log("reconciled", run_id=self.key, effect_id=item.effect_id, found=found, status=status)

    def step(self, ledger):
        done = ledger.next_allowed_action
        if done == "sources_collected":
            evidence = f"artifact://sources/{self.key}.json#sha256={hash_input(FIGURES)[:16]}"
        elif done == "create_internal_draft":
            evidence = self.create_draft()
            if evidence is None:  # reconcile first
                return self.resume()
        elif done == "compare_figures":
            evidence = self.compare_figures(ledger)
        else:
            raise Stop(f"next_allowed_action {done!r} is not a step of this agent")
        log("step done", run_id=self.key, step=done, evidence=evidence)
        ledger.completed.append(Step(done, evidence))
        ledger.pending = [p for p in ledger.pending if p != done]
        ledger.next_allowed_action = ledger.pending[0] if ledger.pending else "done"
        return self.save(ledger)

    def save(self, ledger):
        ledger.checkpoint_version += 1
        try:
            cp = self.c.save_ledger(self.key, self.claim.lease_owner, ledger)
        except (airlock.VersionConflictError, airlock.LeaseLostError) as e:
            raise Stop(f"another process owns the run now: {e}")
        log("ledger saved", run_id=self.key, checkpoint_version=cp, next_allowed_action=ledger.next_allowed_action)
        return ledger

    def draft(self):
        body = f"Weekly report ({self.key}), internal draft\n\n" + "".join(f"- {k}: {v}\n" for k, v in FIGURES)
        return "Weekly report " + self.key, body

    def create_draft(self):
        """The external effect, planned before and confirmed after."""
        title, body = self.draft()
        h = hash_input({"run_id": self.key, "title": title, "body": body})
        try:
            plan = self.c.plan(self.key, EFFECT_ID, self.claim.lease_owner, ACTION, TARGET, h)
        except airlock.ReconcileFirstError:
            return None
        except airlock.InputMismatchError as e:
            raise Stop(str(e))
        if plan.approval is not None:
            print(f"approval needed for {EFFECT_ID}: {plan.approval.approve_url}", flush=True)
            raise Wait(f"approval {plan.approval.id}")
        if not plan.execute:
            log("effect already confirmed; not repeating it", run_id=self.key, effect_id=EFFECT_ID,
                receipt=plan.receipt)
            return plan.receipt
        crash_point("before_create")
        doc = self.docs.create(self.key, title, body)
        crash_point("after_create")
        receipt = "doc://" + self.docs.get("doc://" + doc["id"])["id"]  # what the system holds
        log("document created", run_id=self.key, effect_id=EFFECT_ID, receipt=receipt)
        crash_point("before_receipt")
        self.c.confirm(self.key, EFFECT_ID, self.claim.lease_owner, receipt)
        return receipt

    def compare_figures(self, ledger):
        receipt = ledger.evidence_of("create_internal_draft")
        try:
            doc = self.docs.get(receipt)
        except OSError as e:
            raise Stop(f"the draft {receipt} cannot be read: {e}")
        for k, v in FIGURES:
            if f"{k}: {v}" not in doc["body"]:
                raise Stop(f"the draft's {k} differs from the sources")
        return f"check://{doc['id']}/figures-match/{len(FIGURES)}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--airlock", default=os.environ.get("AIRLOCK_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--api-key", default=os.environ.get("AIRLOCK_API_KEY", ""))
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--docs", required=True)
    ap.add_argument("--lease", type=int, default=30, help="lease length in seconds; renewed every third of it")
    ap.add_argument("--wait", type=float, default=120, help="seconds to wait for another process's lease")
    a = ap.parse_args()
    if not a.api_key:
        ap.error("--api-key (or AIRLOCK_API_KEY) is required")
    agent = Agent(airlock.Client(a.airlock, a.api_key), a.run_id, Docs(a.docs), a.lease, a.wait)
    try:
        agent.run()
    except Stop as e:
        log("stopped", err=str(e))
        return 2
    except airlock.LeaseLostError as e:
        log("stopped", err=f"the lease is gone: {e}")
        return 2
    except Wait as e:
        log("waiting", err=str(e))
        return 3
    except airlock.AirlockError as e:
        log("failed", err=str(e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
