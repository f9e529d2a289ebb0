"""The client against a real airlock, on SQLite and (when given) PostgreSQL."""

import threading
import time
import unittest

import harness
from harness import unique

import airlock
from airlock import Client, Ledger, Step, ToolCall, hash_input
from proxy import LossyProxy

# Payloads whose canonical form differs from a naive json.dumps(sort_keys=True): key order
# by UTF-16 code units (an emoji sorts before U+E000), numbers as ECMAScript prints them,
# strings unescaped except for quotes, backslashes and control characters.
TRICKY_PAYLOADS = [
    {"b": 1, "a": 2, "aa": [3, 2, 1]},
    {"\ue000": "private use", "\U0001F600": "emoji", "z": "é ü 日本"},
    {"n": [1.0, 100, 1e21, 1e20, 1e-7, 1e-6, 0.1, 2 ** 53 + 1, -0.0, 123456789.125, 5e-324, 1.7976931348623157e308]},
    {"s": "tab\there \"quoted\" back\\slash \u0001 \u001f \u007f </script> \u2028"},
    {"nested": {"deep": [{"y": None, "x": True}, False, []], "empty": {}}},
    [],
    "just a string",
    -12.5,
]


class ClientBase:
    server: harness.Server

    def client(self, scope: str = "runs", **kw) -> Client:
        return Client(self.server.url, self.server.keys[scope], **kw)

    def claim(self, prefix: str = "run", payload=None, lease_seconds: int = 30):
        c = self.client()
        key = unique(prefix)
        cl = c.claim(key, payload if payload is not None else {"key": key}, lease_seconds=lease_seconds)
        self.assertTrue(cl.claimed, cl)
        return c, key, cl

    # --- runs ------------------------------------------------------------------

    def test_claim_duplicate_mismatch_heartbeat_transition(self):
        c = self.client()
        key = unique("ticket")
        cl = c.claim(key, {"ticket": 42}, lease_seconds=30, trigger_source="py-test",
                     meta={"workflow_version": "v1", "model": {"provider": "test", "name": "m"}})
        self.assertTrue(cl.claimed)
        self.assertEqual((cl.state, cl.version), ("processing", 1))
        self.assertTrue(cl.lease_owner)
        self.assertEqual(cl.payload_hash, hash_input({"ticket": 42}))
        dup = c.claim(key, {"ticket": 42})
        self.assertFalse(dup.claimed)
        self.assertEqual(dup.state, "processing")
        self.assertEqual(dup.lease_owner, "")
        self.assertIsNotNone(dup.lease_expires_at, "a duplicate while processing says when the lease lapses")
        with self.assertRaises(airlock.PayloadMismatchError) as cm:
            c.claim(key, {"ticket": 43})
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "payload_mismatch"))

        lease = c.heartbeat(key, cl.lease_owner, cl.version, lease_seconds=60)
        self.assertEqual(lease.version, cl.version, "a heartbeat moves the lease, not the version")
        self.assertGreater(lease.expires_at, cl.lease_expires_at)
        with self.assertRaises(airlock.LeaseLostError):
            c.heartbeat(key, "not-the-owner", cl.version)
        with self.assertRaises(airlock.VersionConflictError):
            c.transition(key, cl.lease_owner, cl.version + 5, "completed")
        with self.assertRaises(airlock.InvalidTransitionError):
            c.transition(key, cl.lease_owner, cl.version, "approved")
        t = c.transition(key, cl.lease_owner, cl.version, airlock.STATE_COMPLETED, result={"reply_id": "r-1"})
        self.assertEqual(t.state, "completed")
        again = c.claim(key, {"ticket": 42})
        self.assertFalse(again.claimed)
        self.assertEqual((again.state, again.result), ("completed", {"reply_id": "r-1"}))

        run = c.run(key)
        self.assertEqual((run.state, run.duplicates), ("completed", 2))
        events, next_after = c.events(key)
        kinds = [e.kind for e in events]
        self.assertIn("claimed", kinds)
        self.assertIn("duplicate", kinds)
        self.assertEqual(next_after, 0)
        page, after = c.events(key, limit=1)
        self.assertEqual(len(page), 1)
        self.assertEqual(after, page[0].id)
        ex = c.explain(key)
        self.assertTrue(ex["processed"]["claimed"])
        self.assertEqual(ex["processed"]["state"], "completed")

    def test_transition_alert_tells_a_person(self):
        # A client that gives up says why: alert= on failed_terminal raises workflow_gave_up
        # with the reason; with any other state the server refuses it and writes nothing.
        c, key, cl = self.claim("gaveup")

        def alerts():
            return [e.detail for e in c.events(key)[0] if e.kind == "alert"]

        for to in ("completed", "failed_retryable"):
            with self.assertRaises(airlock.InvalidFieldError) as cm:
                c.transition(key, cl.lease_owner, cl.version, to, alert="no")
            self.assertEqual(cm.exception.status, 400)
        self.assertEqual(alerts(), [], "a refused transition wrote an alert")
        t = c.transition(key, cl.lease_owner, cl.version, "failed_terminal",
                         result={"reason": "invalid_model_output"}, alert="invalid model output after 2 repairs")
        self.assertEqual(t.state, "failed_terminal")
        got = alerts()
        self.assertEqual(len(got), 1, got)
        self.assertEqual((got[0]["alert"], got[0]["reason"]),
                         ("workflow_gave_up", "invalid model output after 2 repairs"))
        # Without alert= a failed_terminal stays silent.
        c2, key2, cl2 = self.claim("gaveup-quiet")
        c2.transition(key2, cl2.lease_owner, cl2.version, "failed_terminal")
        self.assertEqual([e for e in c2.events(key2)[0] if e.kind == "alert"], [])

    def test_payload_hash_is_the_servers(self):
        c = self.client()
        for p in TRICKY_PAYLOADS:
            with self.subTest(payload=p):
                key = unique("hash")
                cl = c.claim(key, p)
                self.assertEqual(cl.payload_hash, hash_input(p), airlock.canonical_json(p))
                # The hash sent instead of the payload is the same key's same payload.
                dup = c.claim(key, payload_hash=hash_input(p))
                self.assertFalse(dup.claimed)

    def test_typed_errors_from_the_server(self):
        c = self.client()
        with self.assertRaises(airlock.RunNotFoundError) as cm:
            c.run(unique("missing"))
        self.assertEqual(cm.exception.status, 404)
        with self.assertRaises(airlock.UnauthenticatedError):
            Client(self.server.url, "not-a-key").run("x")
        with self.assertRaises(airlock.ForbiddenError):
            self.client("worker").claim(unique("w"), {})
        with self.assertRaises(airlock.MissingFieldError):
            c.claim("", {})
        _, key, cl = self.claim()
        with self.assertRaises(airlock.LedgerNotFoundError):
            c.ledger(key)
        with self.assertRaises(airlock.UnknownActionTypeError):
            c.plan(key, "e1", cl.lease_owner, "no_such_type", "t", hash_input(1))
        with self.assertRaises(airlock.InvalidLedgerError) as cm:
            c.save_ledger(key, cl.lease_owner, Ledger(goal="", checkpoint_version=1, next_allowed_action="x"))
        self.assertTrue(cm.exception.errors, "invalid_ledger lists the schema violations")
        self.assertTrue(cm.exception.errors[0].pointer.startswith("/"))

    # --- idempotency -----------------------------------------------------------

    def test_a_lost_reply_is_retried_with_the_same_key(self):
        proxy = LossyProxy(self.server.url)
        self.addCleanup(proxy.close)
        c = Client(proxy.url, self.server.keys["runs"], retries=2)
        key = unique("lost")
        proxy.plan = ["drop"]  # the claim commits, its answer is lost
        cl = c.claim(key, {"n": 1}, lease_seconds=30)
        self.assertTrue(cl.claimed, "the retry is answered from the first request's record, not as a duplicate")
        self.assertFalse(cl.reclaimed)
        (m1, _, h1), (m2, _, h2) = proxy.seen[-2:]
        self.assertEqual(h1["idempotency-key"], h2["idempotency-key"])
        proxy.plan = ["503"]  # an outage answer, then the real one
        start = time.monotonic()
        lease = c.heartbeat(key, cl.lease_owner, cl.version)
        self.assertGreaterEqual(time.monotonic() - start, 0.9, "the retry waits the answer's Retry-After")
        self.assertEqual(lease.version, 1)
        self.assertEqual(proxy.seen[-1][2]["idempotency-key"], proxy.seen[-2][2]["idempotency-key"])
        proxy.plan = ["drop"]
        t = c.transition(key, cl.lease_owner, cl.version, "completed")
        self.assertEqual(t.state, "completed", "a replayed transition answers its result, not version_conflict")

        # Without retries the lost reply is a TransportError, and a fresh call with a
        # fresh key is a duplicate: what the key saves callers from.
        bare = Client(proxy.url, self.server.keys["runs"], retries=0)
        key2 = unique("lost")
        proxy.plan = ["drop"]
        with self.assertRaises(airlock.TransportError):
            bare.claim(key2, {"n": 2})
        self.assertFalse(bare.claim(key2, {"n": 2}).claimed)

    def test_every_mutating_call_sends_an_idempotency_key(self):
        proxy = LossyProxy(self.server.url)
        self.addCleanup(proxy.close)
        c = Client(proxy.url, self.server.keys["runs"])
        w = Client(proxy.url, self.server.keys["worker"])
        key = unique("idem")
        cl = c.claim(key, {"k": key})
        c.heartbeat(key, cl.lease_owner, cl.version)
        c.validate(key, cl.lease_owner, cl.version, "ticket_reply", {"label": "refund", "text": "ok"})
        c.queue_effect(key, cl.lease_owner, cl.version, "crm_note", "default", {"note": "n"}, effect_id="n1")
        q = c.queue_effect(key, cl.lease_owner, cl.version, "digest", "team", {"d": 1}, effect_id="d1")
        c.cancel_effect(q.effect.id, reason="test", lease_owner=cl.lease_owner)
        we = w.claim_effect(["crm_note"])
        w.complete_effect(we.id, we.lease_owner, provider_id="p-1")
        c.save_ledger(key, cl.lease_owner, Ledger(goal="g", pending=["a"], next_allowed_action="a", checkpoint_version=1))
        c.plan(key, "doc-1", cl.lease_owner, "create_doc", "docs", hash_input("d"))
        c.confirm(key, "doc-1", cl.lease_owner, "doc://1")
        c.record_tool_call(key, ToolCall(tool="create_doc", cls="effect", decision="allowed", effect_id="doc-1"))
        c.report_failure(key, cl.lease_owner, cl.version, "transport_timeout")
        c.transition(key, cl.lease_owner, cl.version, "failed_terminal")
        mutating = [(m, p, h) for m, p, h in proxy.seen if m != "GET"]
        self.assertGreaterEqual(len(mutating), 14)
        keys = [h.get("idempotency-key") for _, _, h in mutating]
        for (m, p, h), k in zip(mutating, keys):
            self.assertTrue(k, f"{m} {p} sent no Idempotency-Key")
        self.assertEqual(len(set(keys)), len(keys), "one key per logical request")

    def test_a_pinned_key_gets_the_first_answer_back(self):
        c = self.client()
        key = unique("pinned")
        first = c.claim(key, {"p": 1}, idempotency_key=key + "/claim")
        second = c.claim(key, {"p": 1}, idempotency_key=key + "/claim")
        self.assertTrue(second.claimed)
        self.assertEqual(first.lease_owner, second.lease_owner)
        with self.assertRaises(airlock.IdempotencyKeyReusedError):
            c.claim(key, {"p": 2}, idempotency_key=key + "/claim")

    # --- validation and failures ----------------------------------------------

    def test_validate_and_report_failure(self):
        c, key, cl = self.claim("val")
        v = c.validate(key, cl.lease_owner, cl.version, "ticket_reply",
                       'Here you go: ```json\n{"label": "refund", "text": "We refunded you."}\n```')
        self.assertTrue(v.valid)
        self.assertEqual(v.value, {"label": "refund", "text": "We refunded you."})
        with self.assertRaises(airlock.NoSchemaError):
            c.validate(key, cl.lease_owner, v.version, "crm_note", {})
        d = c.report_failure(key, cl.lease_owner, v.version, "rate_limited", retry_after_ms=1500, detail="429")
        self.assertEqual((d.decision, d.level), ("retry", "transport"))
        self.assertGreaterEqual(d.retry_after_ms, 1500)
        self.assertAlmostEqual(d.retry_after, d.retry_after_ms / 1000)
        d = c.report_failure(key, cl.lease_owner, d.version, "server_error")
        self.assertEqual((d.decision, d.level, d.state), ("retry", "business", "failed_retryable"))
        again = c.claim(key, {"key": key})
        self.assertTrue(again.claimed and again.reclaimed, "a business retry is reclaimed by the next claim")
        self.assertEqual(again.version, d.version + 1)
        bad = c.validate(key, again.lease_owner, again.version, "ticket_reply", {"label": "nope", "text": "x"})
        self.assertFalse(bad.valid)
        self.assertTrue(bad.errors)

    # --- effects ---------------------------------------------------------------

    def test_effects_queue_worker_complete_fail_unknown(self):
        c, key, cl = self.claim("fx")
        w = self.client("worker")
        q = c.queue_effect(key, cl.lease_owner, cl.version, "fx_note", "default", {"note": "Refund"}, effect_id="n1")
        self.assertTrue(q.created)
        self.assertEqual((q.effect.state, q.effect.effect_id, q.effect.executor), ("pending", "n1", "worker"))
        same = c.queue_effect(key, cl.lease_owner, cl.version, "fx_note", "default", {"note": "Refund"},
                              effect_id="n1")
        self.assertFalse(same.created)
        self.assertEqual(same.effect.id, q.effect.id)
        with self.assertRaises(airlock.EffectMismatchError):
            c.queue_effect(key, cl.lease_owner, cl.version, "fx_note", "default", {"note": "other"}, effect_id="n1")
        c.queue_effect(key, cl.lease_owner, cl.version, "fx_note", "second", {"note": "2"}, effect_id="n2")
        c.queue_effect(key, cl.lease_owner, cl.version, "fx_note", "third", {"note": "3"}, effect_id="n3")
        got = {}
        for _ in range(3):
            we = w.claim_effect(["fx_note"], lease_seconds=60)
            self.assertIsNotNone(we)
            got[we.effect_id] = we
        self.assertIsNone(w.claim_effect(["fx_note"]), "nothing more is due")
        self.assertEqual(got["n1"].idempotency_key, f"{key}/n1")
        self.assertEqual(got["n1"].payload, {"note": "Refund"})
        done = w.complete_effect(got["n1"].id, got["n1"].lease_owner, provider_id="crm-77")
        self.assertEqual((done.state, done.provider_id), ("completed", "crm-77"))
        with self.assertRaises(airlock.LeaseLostError):
            w.complete_effect(got["n2"].id, "not-the-lease", provider_id="x")
        failed = w.fail_effect(got["n2"].id, got["n2"].lease_owner, retryable=False, failure_class="http_400")
        self.assertEqual(failed.state, "failed")
        unk = w.unknown_effect(got["n3"].id, got["n3"].lease_owner, failure_class="timeout")
        self.assertEqual(unk.state, "unknown")
        with self.assertRaises(airlock.EffectsOpenError):
            c.transition(key, cl.lease_owner, cl.version, "completed")
        states = {e.effect_id: e.state for e in c.run(key).effects}
        self.assertEqual(states, {"n1": "completed", "n2": "failed", "n3": "unknown"})

    def test_cancel_a_windowed_effect(self):
        c, key, cl = self.claim("win")
        q = c.queue_effect(key, cl.lease_owner, cl.version, "digest", "team", {"digest": 1}, effect_id="d1")
        self.assertTrue(q.created)
        self.assertIsNotNone(q.not_before)
        self.assertIn("/", q.cancel_url)
        with self.assertRaises(airlock.LeaseLostError):
            c.cancel_effect(q.effect.id, reason="nope", lease_owner="someone-else")
        out = c.cancel_effect(q.effect.id, reason="changed my mind", lease_owner=cl.lease_owner)
        self.assertEqual(out.state, "cancelled")
        q2 = c.queue_effect(key, cl.lease_owner, cl.version, "crm_note", "default", {"n": 1}, effect_id="n1")
        with self.assertRaises(airlock.NotResolvableError):
            self.client("operator").cancel_effect(q2.effect.id, reason="no window")

    def test_queued_approval_status(self):
        c, key, cl = self.claim("appr")
        q = c.queue_effect(key, cl.lease_owner, cl.version, "share_doc", "team", {"doc": 1}, effect_id="s1")
        self.assertIsNone(q.effect)
        self.assertIsNotNone(q.approval)
        self.assertEqual(q.approval.state, "awaiting_human")
        self.assertIn("/approve/", q.approval.approve_url)
        self.assertNotIn(q.approval.approve_url, repr(q), "the link is a secret: not in repr")
        st = c.approval_status(key, q.approval.id)
        self.assertEqual((st.status, st.action_type, st.effect_id), ("pending", "share_doc", "s1"))
        self.assertEqual(self.server.approve(q.approval.approve_url), 200)
        st = c.approval_status(key, q.approval.id)
        self.assertEqual((st.status, st.approver), ("approved", "lead"))
        self.assertEqual(c.run(key).state, "approved")
        with self.assertRaises(airlock.ApprovalNotFoundError):
            c.approval_status(key, "no-such-approval")

    def test_list_approvals_pages_and_undecidable(self):
        """GET /v1/approvals: newest first, in keyset pages; undecidable=True keeps the
        approvals for a role nobody holds (legal), not those the lead may decide; no
        token in the rows; an operator key only; a bad filter is invalid_field."""
        made = []
        for action in ("share_doc", "legal_share", "legal_share"):
            c, key, cl = self.claim("list")
            q = c.queue_effect(key, cl.lease_owner, cl.version, action, "team", {"doc": key}, effect_id="e1")
            self.assertIsNotNone(q.approval)
            made.append((key, q.approval))
        op = self.client("operator")
        seen, after, pages = [], "", 0
        while True:
            page, after = op.list_approvals(limit=1, after=after)
            self.assertLessEqual(len(page), 1)
            seen += page
            pages += 1
            if not after:
                break
            self.assertLess(pages, 100, "the pages never end")
        mine = [a for a in seen if a.key in {k for k, _ in made}]
        self.assertEqual([a.key for a in mine], [k for k, _ in reversed(made)], "newest first over pages")
        self.assertEqual(len({a.id for a in seen}), len(seen), "no row on two pages")
        for (key, ap), row in zip(reversed(made), mine):
            self.assertEqual((row.id, row.mode, row.target), (ap.id, "approve_before_act", "team"))
            self.assertTrue(row.console_url.endswith("/console/approvals/" + ap.id), row.console_url)
            self.assertIsNotNone(row.created_at)
            self.assertGreater(row.expires_at, row.created_at)
            token = ap.approve_url.rsplit("/", 1)[-1]
            self.assertNotIn(token, repr(row.raw), "the list carries no approval token")
        by_key = {a.key: a for a in mine}
        self.assertEqual(by_key[made[0][0]].approver_roles, ["support-lead"])
        self.assertIsNone(by_key[made[0][0]].undecidable_since)
        self.assertEqual(by_key[made[1][0]].approver_roles, ["legal"])
        self.assertIsNotNone(by_key[made[1][0]].undecidable_since)

        stuck, nxt = op.list_approvals(undecidable=True, limit=500)
        self.assertEqual(nxt, "")
        stuck_mine = [a.key for a in stuck if a.key in by_key]
        self.assertEqual(stuck_mine, [made[2][0], made[1][0]], "only the legal ones, newest first")
        self.assertTrue(all(a.undecidable_since is not None for a in stuck))
        first, nxt = op.list_approvals(undecidable=True, limit=1)
        self.assertEqual(len(first), 1)
        self.assertNotEqual(nxt, "")
        second, _ = op.list_approvals(undecidable=True, limit=1, after=nxt)
        self.assertEqual([a.key for a in first + second][:2], [a.key for a in stuck][:2])

        with self.assertRaises(airlock.ForbiddenError):
            self.client("runs").list_approvals()
        for bad in ({"limit": 501}, {"limit": -1}, {"after": "x"}):
            with self.assertRaises(airlock.InvalidFieldError, msg=str(bad)):
                op.list_approvals(**bad)

    # --- the ledger ------------------------------------------------------------

    def test_ledger_plan_confirm_crash_reconcile(self):
        c, key, cl = self.claim("ledger")
        owner = cl.lease_owner
        self.assertEqual(c.resume(key).verdict, airlock.VERDICT_CONTINUE)
        l0 = Ledger(goal="Draft the report", invariants=["never email customers"], pending=["draft", "review"],
                    next_allowed_action="draft", checkpoint_version=1)
        self.assertEqual(c.save_ledger(key, owner, l0), 1)
        with self.assertRaises(airlock.VersionConflictError):
            c.save_ledger(key, owner, l0)  # checkpoint 1 again: compare-and-set refuses it
        l = c.ledger(key)
        self.assertEqual((l.run_id, l.checkpoint_version, l.next_allowed_action), (key, 1, "draft"))
        l.invariants = ["anything goes"]
        l.checkpoint_version = 2
        with self.assertRaises(airlock.InvariantsChangedError):
            c.save_ledger(key, owner, l)
        self.assertEqual(c.ledger_schema()["$schema"].split("/")[-2], "2020-12")

        h = hash_input({"title": "Report", "body": "figures"})
        p = c.plan(key, "doc-1", owner, "create_doc", "docs", h)
        self.assertTrue(p.execute)
        # The process "crashes" here: planned, never confirmed.
        r = c.resume(key)
        self.assertEqual(r.verdict, airlock.VERDICT_RECONCILE)
        self.assertEqual([(i.effect_id, i.action, i.input_hash, i.run_id) for i in r.reconcile],
                         [("doc-1", "create_doc", h, key)])
        with self.assertRaises(airlock.ReconcileFirstError):
            c.plan(key, "doc-1", owner, "create_doc", "docs", h)
        self.assertEqual(c.reconcile(key, "doc-1", owner, []), airlock.EFFECT_CLEARED)
        self.assertTrue(c.plan(key, "doc-1", owner, "create_doc", "docs", h).execute)
        c.confirm(key, "doc-1", owner, "doc://1", result={"url": "https://docs/1"})
        again = c.plan(key, "doc-1", owner, "create_doc", "docs", h)
        self.assertEqual((again.execute, again.receipt, again.result), (False, "doc://1", {"url": "https://docs/1"}))
        eff = {e.effect_id: e for e in c.ledger(key).effects}
        self.assertEqual((eff["doc-1"].status, eff["doc-1"].receipt), ("confirmed", "doc://1"))

        l = c.ledger(key)
        l.completed.append(Step("draft", "doc://1"))
        l.pending = ["review"]
        l.next_allowed_action = "review"
        l.checkpoint_version += 1
        self.assertEqual(c.save_ledger(key, owner, l), 2)
        self.assertEqual(c.resume(key).next_allowed_action, "review")

        # A second effect found twice by the search: unknown, and the verdict stops.
        c.plan(key, "doc-2", owner, "create_doc", "docs", hash_input("two"))
        self.assertEqual(c.reconcile(key, "doc-2", owner, ["doc://a", "doc://b"]), airlock.EFFECT_UNKNOWN)
        r = c.resume(key)
        self.assertEqual(r.verdict, airlock.VERDICT_STOP)
        self.assertTrue(r.reasons)
        with self.assertRaises(airlock.InputMismatchError):
            c.plan(key, "doc-1", owner, "create_doc", "docs", hash_input("other input"))

    def test_gated_plan_waits_then_executes_once(self):
        c, key, cl = self.claim("gated", lease_seconds=30)
        h = hash_input({"share": "doc://1"})
        p = c.plan(key, "share-1", cl.lease_owner, "share_doc", "team", h)
        self.assertFalse(p.execute)
        self.assertIsNotNone(p.approval)
        self.assertEqual(c.resume(key).verdict, airlock.VERDICT_WAIT)
        self.assertEqual(c.approval_status(key, p.approval.id).status, "pending")
        self.assertFalse(c.claim(key, {"key": key}).claimed, "the run waits for a person")
        self.server.approve(p.approval.approve_url)
        self.assertEqual(c.approval_status(key, p.approval.id).status, "approved")
        cl2 = c.claim(key, {"key": key})
        self.assertTrue(cl2.claimed and cl2.reclaimed)
        p2 = c.plan(key, "share-1", cl2.lease_owner, "share_doc", "team", h)
        self.assertTrue(p2.execute)
        c.confirm(key, "share-1", cl2.lease_owner, "share://1")
        self.assertEqual(c.plan(key, "share-1", cl2.lease_owner, "share_doc", "team", h).receipt, "share://1")

    def test_record_tool_call(self):
        c, key, cl = self.claim("call")
        c.record_tool_call(key, ToolCall(tool="search", cls="read", decision="allowed", upstream="web"))
        events, _ = c.events(key)
        calls = [e for e in events if e.kind == "tool_call"]
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0].detail["tool"], "search")

    # --- leases ----------------------------------------------------------------

    def test_keep_lease_renews_and_stops_on_loss(self):
        c, key, cl = self.claim("lease", lease_seconds=1)
        with c.keep_lease(cl, lease_seconds=1, interval=0.2) as lease:
            time.sleep(1.6)  # past the 1 s lease: only the heartbeats keep it
            lease.check()
            self.assertGreater(lease.beats, 3)
            # Still the owner: a save under the lease is accepted.
            c.save_ledger(key, cl.lease_owner, Ledger(goal="g", pending=["a"], next_allowed_action="a",
                                                      checkpoint_version=1))
        beats = lease.beats
        time.sleep(0.5)
        self.assertEqual(lease.beats, beats, "leaving the block stops the heartbeats")

        # Another process takes the run over: the keeper notices and stops.
        c2, key2, cl2 = self.claim("lease", lease_seconds=1)
        keeper = c2.keep_lease(cl2, lease_seconds=1, interval=0.2)
        with keeper:
            c2.report_failure(key2, cl2.lease_owner, cl2.version, "server_error")  # failed_retryable: reclaimable
            other = c2.claim(key2, {"key": key2})
            self.assertTrue(other.reclaimed)
            self.assertTrue(keeper.lost.wait(5), "the keeper noticed the lease is gone")
            with self.assertRaises(airlock.LeaseLostError):
                keeper.check()
            n = keeper.beats
            time.sleep(0.5)
            self.assertEqual(keeper.beats, n, "no heartbeats after the loss")
        with self.assertRaises(ValueError):
            c.keep_lease(other.__class__.from_json({"claimed": False, "key": "k"}), 5)

    def test_verify_asks_airlock_before_acting(self):
        c, key, cl = self.claim("verify", lease_seconds=1)
        # No heartbeat between (interval 60 s): the keeper's view goes stale, as in a pause.
        with c.keep_lease(cl, lease_seconds=1, interval=60) as lease:
            renewed = lease.verify()  # held: renewed for another lease_seconds
            self.assertIsNotNone(renewed.expires_at)
            time.sleep(1.3)  # paused past the lease; another process takes the run over
            other = c.claim(key, {"key": key}, lease_seconds=30)
            self.assertTrue(other.reclaimed)
            lease.check()  # the keeper has not seen it
            with self.assertRaises(airlock.LeaseLostError):
                lease.verify()
            self.assertTrue(lease.lost.is_set())
            with self.assertRaises(airlock.LeaseLostError):
                lease.check()


harness.per_backend(ClientBase, globals())

if __name__ == "__main__":
    unittest.main()
