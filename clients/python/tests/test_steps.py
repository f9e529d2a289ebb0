"""Plan input, every plan answer, rejections' reasons and the step API, against a real
airlock on SQLite and (when given) PostgreSQL; the onboarding example killed at every step
boundary."""

import http.cookiejar
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import harness
from harness import unique

import airlock
from airlock import hash_input

EXAMPLE = os.path.join(harness.PYROOT, "examples", "onboard.py")
CRASH = os.path.join(harness.HERE, "crash.py")
POINTS = ("before_perform", "after_perform", "after_confirm")
STEPS = ("draft", "crm", "share")


def approval_page(server: harness.Server, approve_url: str) -> str:
    """The approval page as the signed-in approver sees it."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    headers = {"Origin": server.url, "Content-Type": "application/x-www-form-urlencoded"}
    login = urllib.parse.urlencode({"username": harness.APPROVER[0], "password": harness.APPROVER[1]}).encode()
    opener.open(urllib.request.Request(server.url + "/login", data=login, headers=headers), timeout=10).close()
    with opener.open(approve_url, timeout=10) as r:
        return r.read().decode()


class StepsBase:
    server: harness.Server

    def client(self, scope: str = "runs") -> airlock.Client:
        return airlock.Client(self.server.url, self.server.keys[scope])

    def effect_of(self, key: str, effect_id: str):
        return next(e for e in self.client().run(key).effects if e.effect_id == effect_id)

    # --- issue 34: input, every plan answer, the reason of a rejection -----------

    def test_plan_input_reaches_the_approval_card(self):
        c = self.client()
        key = unique("input")
        cl = c.claim(key, {"k": key}, lease_seconds=30)
        refund = {"order": "A-1042", "amount_jpy": 4800}
        p = c.plan(key, "refund-1", cl.lease_owner, "share_doc", "team", input=refund)
        self.assertIsNotNone(p.approval)
        page = approval_page(self.server, p.approval.approve_url)
        self.assertIn("A-1042", page)
        self.assertIn("4800", page)
        # The hash is the input's: the same input with its hash given is the same effect.
        with self.assertRaises(airlock.InvalidFieldError):
            c.plan(key, "refund-2", cl.lease_owner, "share_doc", "team", hash_input({"other": 1}), input=refund)

    def test_sent_without_provider_id_is_a_confirmed_answer(self):
        c, op = self.client(), self.client("operator")
        key = unique("noid")
        cl = c.claim(key, {"k": key}, lease_seconds=30)
        doc = {"title": "Q4"}
        self.assertTrue(c.plan(key, "doc-1", cl.lease_owner, "create_doc", "docs", input=doc).execute)
        self.assertEqual(c.reconcile(key, "doc-1", cl.lease_owner, undetermined=True), airlock.EFFECT_UNKNOWN)
        e = self.effect_of(key, "doc-1")
        op.request("POST", f"/v1/effects/{e.id}/resolve",
                   {"outcome": "sent", "no_provider_id": True, "note": "seen in the docs app", "version": e.version})
        p = c.plan(key, "doc-1", cl.lease_owner, "create_doc", "docs", input=doc)
        self.assertEqual((p.execute, p.confirmed, p.receipt, p.approval), (False, True, "", None))
        # The step API answers it as a replay and records it in the ledger, without performing.
        c.save_ledger(key, cl.lease_owner, airlock.Ledger(goal="g", next_allowed_action="doc-1", pending=["doc-1"],
                                                          checkpoint_version=1))
        c.transition(key, cl.lease_owner, cl.version, "failed_retryable")
        with c.open_run(key, {"k": key}, steps=["doc-1"]) as run:
            r = run.step("doc-1", "create_doc", "docs", doc, lambda s: self.fail("performed again"))
            self.assertEqual((r.receipt, r.replayed, r.confirmed), ("", True, True))
            self.assertEqual([s.step for s in run.client.ledger(key).completed], ["doc-1"])

    def test_rejection_reason_reaches_the_agent(self):
        c = self.client()
        key = unique("reject")
        with c.open_run(key, {"k": key}, lease_seconds=5) as run:
            with self.assertRaises(airlock.ApprovalPendingError) as pend:
                run.step("share", "share_doc", "team", {"doc": "doc://1"}, lambda s: self.fail("performed"))
            self.assertTrue(pend.exception.approve_url)
            self.assertTrue(pend.exception.console_url.endswith("/console/approvals/" + pend.exception.approval_id))
        # A restarted agent whose run still waits learns which approval, and where to see it.
        with self.assertRaises(airlock.ApprovalPendingError) as again:
            c.open_run(key, {"k": key})
        self.assertEqual((again.exception.approval_id, again.exception.effect_id, again.exception.console_url),
                         (pend.exception.approval_id, "share", pend.exception.console_url))
        self.server.approve(pend.exception.approve_url, "reject", "not before legal has read it")
        # A restarted agent learns the reason from the run, one waiting from the approval.
        with self.assertRaises(airlock.RejectedError) as rej:
            c.open_run(key, {"k": key})
        self.assertEqual((rej.exception.reason, rej.exception.rejected_by, rej.exception.effect_id,
                          rej.exception.approval_id),
                         ("not before legal has read it", "lead", "share", pend.exception.approval_id))

        key2 = unique("reject-wait")
        with c.open_run(key2, {"k": key2}, lease_seconds=5) as run:
            urls = []
            orig = run.client.plan

            def plan(*a, **kw):
                p = orig(*a, **kw)
                if p.approval is not None:
                    urls.append(p.approval.approve_url)
                    threading.Timer(0.5, self.server.approve, (p.approval.approve_url, "reject", "wrong team")).start()
                return p
            run.client = _Wrapped(c, plan=plan)
            with self.assertRaises(airlock.RejectedError) as rej:
                run.step("share", "share_doc", "team", {"doc": "doc://2"}, lambda s: self.fail("performed"),
                         wait=20)
            self.assertEqual((rej.exception.reason, rej.exception.effect_id), ("wrong team", "share"))

    def test_skip_effect_rejection_is_a_rejected_error_and_the_run_goes_on(self):
        """approval.on_reject: skip_effect: the step raises RejectedError (who, why, which,
        from the answer's details), records the step as settled without performing it, and
        the next step works; a later start answers the same, and a waiting step too."""
        c = self.client()
        key = unique("skip")
        steps = ["a", "post", "b"]
        with c.open_run(key, {"k": key}, steps=steps, lease_seconds=5) as run:
            run.step("a", "create_doc", "docs", {"n": 1}, lambda s: "r-a")
            with self.assertRaises(airlock.ApprovalPendingError) as pend:
                run.step("post", "post_update", "team", {"text": "hello"}, lambda s: self.fail("performed"))
        self.server.approve(pend.exception.approve_url, "reject", "not this week")
        # The low-level call: the generated class, also a RejectedError, filled from details.
        cl = c.claim(key, {"k": key}, lease_seconds=30)
        with self.assertRaises(airlock.EffectRejectedError) as low:
            c.plan(key, "post", cl.lease_owner, "post_update", "team", input={"text": "hello"})
        self.assertIsInstance(low.exception, airlock.RejectedError)
        self.assertEqual(low.exception.details, {"effect_id": "post", "approval_id": pend.exception.approval_id,
                                                 "rejected_by": "lead", "reason": "not this week"})
        c.transition(key, cl.lease_owner, cl.version, "failed_retryable")
        for _ in range(2):  # a second start answers the same and records the step once
            with c.open_run(key, {"k": key}, steps=steps, lease_seconds=5) as run:
                with self.assertRaises(airlock.RejectedError) as rej:
                    run.step("post", "post_update", "team", {"text": "hello"}, lambda s: self.fail("performed"))
                e = rej.exception
                self.assertEqual((e.reason, e.rejected_by, e.effect_id, e.approval_id, e.code),
                                 ("not this week", "lead", "post", pend.exception.approval_id, "effect_rejected"))
                self.assertEqual(run.ledger.next_allowed_action, "b")
        with c.open_run(key, {"k": key}, steps=steps, lease_seconds=5) as run:
            self.assertEqual(run.step("b", "crm_note", "crm", {"n": 2}, lambda s: "r-b").receipt, "r-b")
            run.complete()
        self.assertEqual([(s.step, s.evidence) for s in c.ledger(key).completed],
                         [("a", "r-a"), ("post", "rejected://" + pend.exception.approval_id), ("b", "r-b")])

        key2 = unique("skip-wait")
        with c.open_run(key2, {"k": key2}, steps=["post", "b"], lease_seconds=5) as run:
            orig = c.plan

            def plan(*a, **kw):
                p = orig(*a, **kw)
                if p.approval is not None:
                    threading.Timer(0.5, self.server.approve, (p.approval.approve_url, "reject", "wrong channel")).start()
                return p
            run.client = _Wrapped(c, plan=plan)
            with self.assertRaises(airlock.RejectedError) as rej:
                run.step("post", "post_update", "team", {"text": "hi"}, lambda s: self.fail("performed"), wait=20)
            self.assertEqual((rej.exception.reason, rej.exception.effect_id), ("wrong channel", "post"))
            self.assertTrue(rej.exception.approval_id)
            self.assertEqual(run.step("b", "crm_note", "crm", {"n": 3}, lambda s: "r-b2").receipt, "r-b2")
            run.complete()
        self.assertEqual(c.run(key2).state, "completed")

    # --- issue 39: the step API -------------------------------------------------

    def test_steps_wait_for_approval_then_perform_once(self):
        c = self.client()
        key = unique("steps")
        done = []

        def perform(s):
            done.append(s.effect_id)
            self.assertEqual(s.idempotency_key, f"{key}/{s.effect_id}")
            return "r-" + s.effect_id

        with c.open_run(key, {"k": key}, steps=["a", "b", "share"], lease_seconds=5, wait_approval=20) as run:
            self.assertEqual(run.ledger.next_allowed_action, "a")
            self.assertFalse(run.step("a", "create_doc", "docs", {"n": 1}, perform).replayed)
            self.assertEqual(run.step("a", "create_doc", "docs", {"n": 1}, perform).replayed, True)
            run.step("b", "crm_note", "crm", {"n": 2}, perform)
            orig = c.plan

            def plan(*a, **kw):
                p = orig(*a, **kw)
                if p.approval is not None:
                    threading.Timer(0.5, self.server.approve, (p.approval.approve_url,)).start()
                return p
            run.client = _Wrapped(c, plan=plan)
            before = run.lease_owner
            r = run.step("share", "share_doc", "team", {"n": 3}, perform)
            self.assertEqual((r.receipt, r.replayed), ("r-share", False))
            self.assertNotEqual(run.lease_owner, before, "the run was claimed again after the approval")
            run.complete({"ok": True})
        self.assertEqual(done, ["a", "b", "share"])
        l = c.ledger(key)
        self.assertEqual([(s.step, s.evidence) for s in l.completed], [("a", "r-a"), ("b", "r-b"), ("share", "r-share")])
        self.assertEqual((l.pending, l.next_allowed_action), ([], airlock.DONE))
        self.assertEqual(c.run(key).state, "completed")
        again = c.open_run(key, {"k": key})
        self.assertTrue(again.finished)
        self.assertEqual(again.result, {"ok": True})
        with self.assertRaises(airlock.RunFinishedError):
            again.step("a", "create_doc", "docs", {"n": 1}, perform)

    def test_reconcile_calls_lookup(self):
        c = self.client()
        for found, want in (([], "performed"), (["r-old"], "r-old"), (["x", "y"], airlock.NeedsPersonError),
                            (None, airlock.NeedsPersonError)):
            key = unique("lookup")
            cl = c.claim(key, {"k": key}, lease_seconds=1)
            self.assertTrue(c.plan(key, "e", cl.lease_owner, "create_doc", "docs", input={"n": 1}).execute)
            time.sleep(1.2)  # the process "died" after planning: its lease lapses
            with c.open_run(key, {"k": key}, lease_seconds=5) as run:
                if isinstance(want, type):
                    with self.assertRaises(want) as e:
                        run.step("e", "create_doc", "docs", {"n": 1}, lambda s: "performed", lambda s: found)
                    self.assertEqual(e.exception.effect_id, "e")
                    self.assertEqual(self.effect_of(key, "e").state, "unknown")
                else:
                    r = run.step("e", "create_doc", "docs", {"n": 1}, lambda s: "performed", lambda s: found)
                    self.assertEqual(r.receipt, want)
        key = unique("nolookup")
        cl = c.claim(key, {"k": key}, lease_seconds=1)
        c.plan(key, "e", cl.lease_owner, "create_doc", "docs", input={"n": 1})
        time.sleep(1.2)
        with c.open_run(key, {"k": key}, lease_seconds=5) as run:
            with self.assertRaises(airlock.NeedsPersonError):
                run.step("e", "create_doc", "docs", {"n": 1}, lambda s: "performed")

    def test_a_held_run_is_waited_out_or_refused(self):
        c = self.client()
        key = unique("busy")
        c.claim(key, {"k": key}, lease_seconds=2)
        with self.assertRaises(airlock.RunBusyError):
            c.open_run(key, {"k": key}, wait_lease=0)
        t0 = time.monotonic()
        with c.open_run(key, {"k": key}, wait_lease=10) as run:
            self.assertTrue(run.reclaimed)
        self.assertGreater(time.monotonic() - t0, 0.5)

    def test_lease_loss_stops_the_steps(self):
        c = self.client()
        key = unique("lost")
        run = c.open_run(key, {"k": key}, lease_seconds=1)
        run.lease.stop()  # heartbeats stop (a paused process): the lease lapses and another takes it
        time.sleep(1.3)
        other = c.claim(key, {"k": key}, lease_seconds=30)
        self.assertTrue(other.claimed)
        with self.assertRaises(airlock.LeaseLostError):
            run.step("e", "create_doc", "docs", {"n": 1}, lambda s: self.fail("performed after losing the lease"))

    # --- the example, killed at every step boundary -----------------------------

    def run_example(self, key: str, provider: str, crash: str = "", wait: str = "0"):
        env = dict(os.environ, AIRLOCK_URL=self.server.url, AIRLOCK_API_KEY=self.server.keys["runs"],
                   PYTHONPATH=harness.PYROOT, AGENT_CRASH_AT=crash, WAIT_APPROVAL=wait,
                   AGENT_CRASH_MARK=os.path.join(provider, "..", "crashed"))
        return subprocess.run([sys.executable, CRASH, EXAMPLE, key, provider], env=env, capture_output=True,
                              text=True, timeout=120)

    def test_example_killed_at_every_boundary_performs_each_effect_once(self):
        for step in STEPS:
            for point in POINTS:
                with self.subTest(step=step, point=point):
                    self.example_case(step, point)

    def example_case(self, step: str, point: str):
        base = tempfile.mkdtemp(prefix="onboard-")
        self.addCleanup(shutil.rmtree, base, True)
        provider = os.path.join(base, "provider")
        os.mkdir(provider)
        key = unique("onboard")
        outcomes = []
        for _ in range(8):
            p = self.run_example(key, provider, crash=f"{point}:{step}")
            if p.returncode == -signal.SIGKILL:
                outcomes.append("killed")
                continue
            m = re.search(r"waiting for approval \S+: (\S+)", p.stderr)
            if m:
                outcomes.append("pending")
                self.assertEqual(self.server.approve(m.group(1)), 200)
                continue
            self.assertEqual(p.returncode, 0, p.stderr)
            outcomes.append("completed")
            break
        self.assertEqual(outcomes[-1], "completed", outcomes)
        self.assertIn("killed", outcomes, "the crash point was reached")
        records = []
        for f in sorted(os.listdir(provider)):
            with open(os.path.join(provider, f)) as fh:
                records.append(json.load(fh))
        self.assertEqual(sorted(r["effect"] for r in records), sorted(STEPS), (step, point, outcomes))
        c = self.client()
        l = c.ledger(key)
        self.assertEqual([s.step for s in l.completed], list(STEPS))
        self.assertEqual(l.next_allowed_action, airlock.DONE)
        self.assertEqual({e.effect_id: e.state for e in c.run(key).effects},
                         {s: "completed" for s in STEPS})
        self.assertEqual(c.run(key).state, "completed")
        # Once more: finished, nothing performed.
        p = self.run_example(key, provider)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(os.listdir(provider)), 3)


class _Wrapped:
    """The client with one method replaced (to act as the approver when an approval opens)."""

    def __init__(self, inner, **over):
        self._inner, self._over = inner, over

    def __getattr__(self, name):
        return self._over.get(name) or getattr(self._inner, name)


harness.per_backend(type("StepsBase", (StepsBase,), {}), globals())
