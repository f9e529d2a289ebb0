"""The step API: a run handle (:meth:`Client.open_run`) and one call per side effect
(:meth:`AgentRun.step`), with the ledger's bookkeeping done for the agent."""

import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

from .errors import (ApprovalPendingError, EffectRejectedError, LedgerNotFoundError, NeedsPersonError,
                     ReconcileFirstError, RejectedError, RunBusyError, RunFinishedError)
from .types import Ledger, Step, Transition

__all__ = ["AgentRun", "StepCall", "StepResult", "DONE"]

#: The ledger's next_allowed_action once every declared step is done.
DONE = "done"

_NO_RECEIPT = "resolved as sent by an operator, without the provider's id"


@dataclass
class StepCall:
    """What ``perform`` and ``lookup`` are called with: the step and the idempotency key
    to give the external system (``"<run key>/<effect id>"``), so a retried call
    there is harmless too."""

    key: str
    effect_id: str
    action: str
    target: str
    input: Any
    idempotency_key: str


@dataclass
class StepResult:
    """A step's outcome: ``receipt`` (empty when an operator resolved it as sent without
    the provider's id), ``replayed`` when it was performed before and answered from
    airlock's record without calling ``perform``, ``result`` the result recorded with it
    (replays, while retained). ``confirmed`` is always true: a step returns only once its
    effect is confirmed."""

    effect_id: str
    receipt: str
    replayed: bool
    result: Any = None
    confirmed: bool = True


class AgentRun:
    """A claimed run, kept: heartbeats from a thread, key, lease owner and version carried
    for every call. Get one from :meth:`Client.open_run`; use it as a context manager (the
    heartbeats stop at the end of the block)::

        with client.open_run("refund-42", {"order": 42}, steps=["refund"]) as run:
            run.step("refund", "refund_order", "shop", {"order": 42, "amount": 30},
                     lambda s: shop.refund(42, 30, idempotency_key=s.idempotency_key),
                     lookup=lambda s: shop.refunds_for(42))
            run.complete({"refunded": 30})

    A run already finished opens with ``finished`` set (``state``, ``result``); its steps
    raise :class:`RunFinishedError`.
    """

    def __init__(self, client: Any, key: str, payload: Any, *, goal: str, steps: Sequence[str],
                 invariants: Sequence[str], lease_seconds: int, wait_lease: float, wait_approval: float,
                 poll: float, meta: Optional[dict]) -> None:
        self.client = client
        self.key = key
        self.payload = payload
        self.goal = goal
        self.steps = list(steps)
        self.invariants = list(invariants)
        self.lease_seconds = lease_seconds
        self.wait_lease = wait_lease
        self.wait_approval = wait_approval
        self.poll = poll
        self.meta = meta
        self.lease_owner = ""
        self.version = 0
        self.state = ""
        self.result: Any = None
        self.finished = False
        self.reclaimed = False
        self.lease: Any = None
        self.ledger: Optional[Ledger] = None

    # --- opening ---------------------------------------------------------------

    def _open(self) -> "AgentRun":
        deadline = time.monotonic() + self.wait_lease
        while True:
            cl = self.client.claim(self.key, self.payload, lease_seconds=self.lease_seconds, meta=self.meta)
            self.state, self.version = cl.state, cl.version
            if cl.claimed:
                self.lease_owner, self.reclaimed = cl.lease_owner, cl.reclaimed
                break
            if cl.state == "processing":
                left = deadline - time.monotonic()
                if left <= 0 or cl.lease_expires_at is None:
                    raise RunBusyError(self.key, cl.lease_expires_at)
                time.sleep(max(min(cl.lease_expires_at.timestamp() - time.time() + 0.1, left), 0.05))
                continue
            if cl.state == "rejected":
                r = cl.result if isinstance(cl.result, dict) else {}
                raise RejectedError(*(str(r.get(f) or "") for f in ("reason", "rejected_by", "effect_id", "approval_id")))
            if cl.state in ("completed", "failed_terminal"):
                self.finished, self.result = True, cl.result
                return self
            if cl.state == "awaiting_human":
                pending = [a for a in self.client.approvals(self.key) if a.status == "pending"]
                if not pending:
                    run = self.client.run(self.key)
                    raise NeedsPersonError("", f"the run is parked for a person ({run.park_reason or 'awaiting_human'})")
                a = pending[-1]
                self._await(a.effect_id, a.id, "", self.wait_approval)
                continue
            raise NeedsPersonError("", f"the run is {cl.state}")
        self._keep()
        try:
            self.ledger = self._read_ledger()
        except BaseException:
            self.close()  # no heartbeats left running behind a failed open
            raise
        return self

    def _read_ledger(self) -> Ledger:
        try:
            return self.client.ledger(self.key)
        except LedgerNotFoundError:
            first = Ledger(goal=self.goal, invariants=list(self.invariants), pending=list(self.steps),
                           next_allowed_action=self.steps[0] if self.steps else "start", checkpoint_version=1)
            self.client.save_ledger(self.key, self.lease_owner, first)
            return self.client.ledger(self.key)

    def _keep(self) -> None:
        if self.lease is not None:
            self.lease.stop()
        self.lease = self.client.keep_lease((self.key, self.lease_owner, self.version), self.lease_seconds)
        self.lease.start()

    def _reclaim(self) -> None:
        """After an approval the run is back to processing with no lease: take it again."""
        self._open()
        if self.finished:
            raise RunFinishedError(self.key, self.state, self.result)

    def _await(self, effect_id: str, approval_id: str, approve_url: str, wait: float) -> None:
        if self.lease is not None:
            self.lease.stop()  # the run waits for a person: this process holds no lease now
            self.lease = None
        console = self.client.base_url + "/console/approvals/" + urllib.parse.quote(approval_id, safe="")
        deadline = time.monotonic() + wait
        while True:
            st = self.client.approval_status(self.key, approval_id)
            if st.status in ("approved", "rejected"):
                # Decided: the next claim and plan tell which way (a rejection ends the run,
                # or answers this effect effect_rejected), with the approver's reason.
                return
            if st.status != "pending":
                raise NeedsPersonError(effect_id, f"its approval {approval_id} is {st.status}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise ApprovalPendingError(st.effect_id or effect_id, approval_id, approve_url, console)
            time.sleep(min(self.poll, left))

    # --- steps -----------------------------------------------------------------

    def step(self, effect_id: str, action: str, target: str, input: Any, perform: Callable[[StepCall], str],
             lookup: Optional[Callable[[StepCall], Optional[List[str]]]] = None, *,
             wait: Optional[float] = None) -> StepResult:
        """Perform one external effect at most once, whatever crashed before.

        Plans ``effect_id`` with ``input`` (a gated action's approval card shows it);
        calls ``perform(call)`` only when airlock answers execute, right after asking
        airlock that the lease is still held, and confirms with the receipt it returns
        (the external system's id for what it did: a non-empty string). A step performed
        before is answered from airlock's record without calling ``perform``. A step
        planned by a process that died before confirming is looked up: ``lookup(call)``
        returns the receipts of the matching records in the external system — none:
        perform it; one: it happened; several, or None (the search cannot tell): raise
        :class:`NeedsPersonError`. A gated step waits up to ``wait`` seconds (default:
        the run's ``wait_approval``) for the decision, then raises
        :class:`ApprovalPendingError`; a rejection raises :class:`RejectedError` with the
        approver's reason. Then the step is recorded in the ledger (completed, pending,
        next allowed action; compare-and-set), once even across restarts. Under
        ``approval.on_reject: skip_effect`` a rejected step is recorded too, as settled
        without performing (evidence ``rejected://<approval id>``), and the run goes on
        with the next step (the error is an :class:`EffectRejectedError`, a RejectedError)."""
        if self.finished:
            raise RunFinishedError(self.key, self.state, self.result)
        call = StepCall(self.key, effect_id, action, target, input, f"{self.key}/{effect_id}")
        wait = self.wait_approval if wait is None else wait
        for _ in range(8):
            self._check()
            try:
                plan = self.client.plan(self.key, effect_id, self.lease_owner, action, target, input=input,
                                        meta=self.meta)
            except EffectRejectedError as e:
                # approval.on_reject: skip_effect: this step is settled without performing
                # it, and the run goes on. The error is also a RejectedError.
                e.effect_id = e.effect_id or effect_id
                self._record(effect_id, "rejected://" + e.approval_id if e.approval_id else "rejected")
                raise
            except ReconcileFirstError:
                if lookup is None:
                    raise NeedsPersonError(effect_id, "it was planned and never confirmed, and the step has no "
                                                      "lookup to search the external system")
                found = lookup(call)
                if found is None:
                    self.client.reconcile(self.key, effect_id, self.lease_owner, undetermined=True)
                    raise NeedsPersonError(effect_id, "the lookup could not tell whether it happened")
                status = self.client.reconcile(self.key, effect_id, self.lease_owner, list(found))
                if status == "unknown":
                    raise NeedsPersonError(effect_id, f"the lookup found {len(found)} matching records")
                continue  # cleared: plan again executes; confirmed: plan again answers the receipt
            if plan.approval is not None:
                self._await(effect_id, plan.approval.id, plan.approval.approve_url, wait)
                self._reclaim()
                continue
            if plan.confirmed:
                self._record(effect_id, plan.receipt)
                return StepResult(effect_id, plan.receipt, True, plan.result)
            self.lease.verify()
            self._hook("before_perform", call)
            receipt = perform(call)
            if not isinstance(receipt, str) or not receipt:
                raise ValueError(f"step {effect_id}: perform must return the effect's receipt (a non-empty string)")
            self._hook("after_perform", call)
            self.client.confirm(self.key, effect_id, self.lease_owner, receipt)
            self._hook("after_confirm", call)
            self._record(effect_id, receipt)
            return StepResult(effect_id, receipt, False)
        raise NeedsPersonError(effect_id, "airlock's answers did not settle (planned again and again)")

    @staticmethod
    def _hook(point: str, call: StepCall) -> None:
        """A seam for crash tests (they replace it to kill the process at a boundary)."""

    def _check(self) -> None:
        if self.lease is None:
            self._reclaim()
        self.lease.check()

    def _record(self, effect_id: str, receipt: str) -> None:
        """The ledger's bookkeeping: once per step (a step already recorded, before a
        crash, is not appended again), compare-and-set on checkpoint_version."""
        l = self.ledger
        assert l is not None
        if any(s.step == effect_id for s in l.completed):
            return
        l.completed.append(Step(effect_id, receipt or _NO_RECEIPT))
        l.pending = [p for p in l.pending if p != effect_id]
        l.next_allowed_action = l.pending[0] if l.pending else (DONE if self.steps else "continue")
        l.checkpoint_version += 1
        self.client.save_ledger(self.key, self.lease_owner, l)

    # --- the end ---------------------------------------------------------------

    def complete(self, result: Any = None) -> Transition:
        """Record the ledger done and move the run to completed with ``result``."""
        if self.finished:
            raise RunFinishedError(self.key, self.state, self.result)
        self._check()
        l = self.ledger
        assert l is not None
        if l.next_allowed_action != DONE or l.pending:
            l.pending, l.next_allowed_action = [], DONE
            l.checkpoint_version += 1
            self.client.save_ledger(self.key, self.lease_owner, l)
        kw = {} if result is None else {"result": result}
        t = self.client.transition(self.key, self.lease_owner, self.version, "completed", **kw)
        self.close()
        self.finished, self.state, self.result = True, "completed", result
        return t

    def close(self) -> None:
        """Stop the heartbeats (the lease then lapses unless the run was completed)."""
        if self.lease is not None:
            self.lease.stop()

    def __enter__(self) -> "AgentRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
