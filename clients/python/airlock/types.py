"""The answers of airlock's API as dataclasses.

Each carries ``raw``, the answer's decoded JSON as airlock sent it, so a field added to
the API later is readable before this client names it. Times are timezone-aware
:class:`datetime.datetime` values; durations keep the API's unit in their name
(``lease_seconds``, ``retry_after_ms``).
"""

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Optional

__all__ = [
    "parse_time", "Claim", "Lease", "Transition", "RunEffect", "Run", "Event", "Validation",
    "FailureDecision", "Approval", "QueuedEffect", "WorkerEffect", "Step", "LedgerEffect", "Ledger",
    "Plan", "ReconcileItem", "Resume", "ApprovalStatus", "PendingApproval", "ToolCall",
    "STATE_PROCESSING", "STATE_COMPLETED", "STATE_FAILED_RETRYABLE", "STATE_FAILED_TERMINAL",
    "STATE_AWAITING_HUMAN", "STATE_APPROVED", "STATE_REJECTED",
    "VERDICT_CONTINUE", "VERDICT_RECONCILE", "VERDICT_WAIT", "VERDICT_STOP",
    "EFFECT_PLANNED", "EFFECT_CONFIRMED", "EFFECT_UNKNOWN", "EFFECT_CLEARED",
]

# Run states.
STATE_PROCESSING = "processing"
STATE_COMPLETED = "completed"
STATE_FAILED_RETRYABLE = "failed_retryable"
STATE_FAILED_TERMINAL = "failed_terminal"
STATE_AWAITING_HUMAN = "awaiting_human"
STATE_APPROVED = "approved"
STATE_REJECTED = "rejected"

# Resume verdicts.
VERDICT_CONTINUE = "continue"    # go on from next_allowed_action
VERDICT_RECONCILE = "reconcile"  # search the external system for each item of reconcile first
VERDICT_WAIT = "wait"            # a person's approval is pending
VERDICT_STOP = "stop"            # a person decides; do not act

# Effect statuses in the ledger.
EFFECT_PLANNED = "planned"      # intent recorded, outcome not yet confirmed
EFFECT_CONFIRMED = "confirmed"  # happened; receipt is the external system's id
EFFECT_UNKNOWN = "unknown"      # a search could not decide: a person must
EFFECT_CLEARED = "cleared"      # a search found nothing: plan again to execute

_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def parse_time(s: Optional[str]) -> Optional[datetime]:
    """An RFC 3339 time as airlock writes it (up to nanoseconds, Z or an offset)."""
    if not s:
        return None
    m = _TIME.match(s)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {s!r}")
    base, frac, zone = m.groups()
    t = datetime.strptime(base, "%Y-%m-%dT%H:%M:%S")
    if frac:
        t = t.replace(microsecond=int((frac + "000000")[:6]))
    if zone == "Z":
        tz = timezone.utc
    else:
        sign = 1 if zone[0] == "+" else -1
        tz = timezone(sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    return t.replace(tzinfo=tz)


def _s(d: Dict[str, Any], k: str) -> str:
    v = d.get(k)
    return v if isinstance(v, str) else ""


def _i(d: Dict[str, Any], k: str) -> int:
    v = d.get(k)
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


@dataclass
class Claim:
    """The answer to a claim. With ``claimed``, ``lease_owner`` and ``version`` are what
    every later call on the run needs; without it, ``state`` (and ``result``, once
    finished) tell what became of the run, and ``lease_expires_at`` (while another
    process holds it) when its lease lapses."""

    claimed: bool
    reclaimed: bool
    key: str
    state: str
    version: int
    payload_hash: str
    lease_owner: str
    lease_expires_at: Optional[datetime]
    result: Any
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Claim":
        return cls(bool(d.get("claimed")), bool(d.get("reclaimed")), _s(d, "key"), _s(d, "state"), _i(d, "version"),
                   _s(d, "payload_hash"), _s(d, "lease_owner"), parse_time(d.get("lease_expires_at")), d.get("result"), d)


@dataclass
class Lease:
    """A renewed lease. A heartbeat moves the lease, never the version."""

    key: str
    version: int
    expires_at: Optional[datetime]
    started_at: Optional[datetime]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Lease":
        return cls(_s(d, "key"), _i(d, "version"), parse_time(d.get("lease_expires_at")),
                   parse_time(d.get("lease_started_at")), d)


@dataclass
class Transition:
    key: str
    state: str
    version: int
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Transition":
        return cls(_s(d, "key"), _s(d, "state"), _i(d, "version"), d)


@dataclass
class RunEffect:
    """An effect as the outbox sees it. ``id`` addresses it under /v1/effects/{id};
    ``effect_id`` is the run's own name for it."""

    id: str
    effect_id: str
    action_type: str
    target: str
    executor: str  # dispatcher, worker or agent
    state: str     # pending, sending, planned, completed, unknown, failed, cancelled
    payload_hash: str
    provider_id: str
    attempts: int
    version: int
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "RunEffect":
        return cls(_s(d, "id"), _s(d, "effect_id"), _s(d, "action_type"), _s(d, "target"), _s(d, "executor"),
                   _s(d, "state"), _s(d, "payload_hash"), _s(d, "provider_id"), _i(d, "attempts"), _i(d, "version"), d)


@dataclass
class Run:
    """GET /v1/runs/{key}: a read-only view that never shows the lease owner."""

    key: str
    state: str
    version: int
    payload_hash: str
    result: Any
    lease_live: bool
    lease_expires_at: Optional[datetime]
    duplicates: int
    reclaims: int
    park_reason: str
    effects: List[RunEffect]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Run":
        lease = d.get("lease") or {}
        return cls(_s(d, "key"), _s(d, "state"), _i(d, "version"), _s(d, "payload_hash"), d.get("result"),
                   bool(lease.get("live")), parse_time(lease.get("expires_at")), _i(d, "duplicates"), _i(d, "reclaims"),
                   _s(d, "park_reason"), [RunEffect.from_json(e) for e in d.get("effects") or []], d)


@dataclass
class Event:
    """One entry of a run's audit timeline."""

    id: int
    at: Optional[datetime]
    kind: str  # claimed, ledger_saved, effect_planned, effect_confirmed, ...
    version: int
    actor: str
    meta: Any
    detail: Any
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Event":
        return cls(_i(d, "id"), parse_time(d.get("at")), _s(d, "kind"), _i(d, "version"), _s(d, "actor"),
                   d.get("meta"), d.get("detail"), d)


@dataclass
class Validation:
    """The answer to validate: the model output against the action type's schema."""

    valid: bool
    repaired: bool
    errors: List[Dict[str, Any]]
    value: Any
    state: str
    version: int
    repairs: int
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Validation":
        return cls(bool(d.get("valid")), bool(d.get("repaired")), list(d.get("errors") or []), d.get("value"),
                   _s(d, "state"), _i(d, "version"), _i(d, "repairs"), d)


@dataclass
class FailureDecision:
    """airlock's decision on a reported failure: retry (after ``retry_after_ms``
    milliseconds), terminal, or reconcile."""

    decision: str
    level: str
    retry_after_ms: int
    attempts: int
    max_attempts: int
    reason: str
    state: str
    version: int
    raw: Dict[str, Any] = field(repr=False)

    @property
    def retry_after(self) -> float:
        """retry_after_ms in seconds (what time.sleep takes)."""
        return self.retry_after_ms / 1000.0

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "FailureDecision":
        return cls(_s(d, "decision"), _s(d, "level"), _i(d, "retry_after_ms"), _i(d, "attempts"),
                   _i(d, "max_attempts"), _s(d, "reason"), _s(d, "state"), _i(d, "version"), d)


@dataclass
class Approval:
    """A pending human decision. ``approve_url`` carries a single-use secret: hand it to
    the approvers, never log it."""

    id: str
    approve_url: str = field(repr=False)
    expires_at: Optional[datetime]
    state: str
    version: int
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Approval":
        return cls(_s(d, "approval_id"), _s(d, "approve_url"), parse_time(d.get("expires_at")), _s(d, "state"),
                   _i(d, "version"), d)


@dataclass
class QueuedEffect:
    """The answer to queue_effect: the effect (queued now, or already queued when
    ``created`` is false), or, for a gated action type, the ``approval`` it waits for
    (and ``effect`` None)."""

    created: bool
    version: int
    effect: Optional[RunEffect]
    approval: Optional[Approval]
    cancel_url: str = field(repr=False)  # act_with_window only
    not_before: Optional[datetime]       # act_with_window only
    raw: Dict[str, Any] = field(repr=False)


@dataclass
class WorkerEffect:
    """An effect leased to an external worker: perform it with ``idempotency_key`` as the
    provider's idempotency key, then complete_effect, fail_effect or unknown_effect."""

    id: str
    key: str
    effect_id: str
    action_type: str
    target: str
    payload: Any
    lease_owner: str
    lease_expires_at: Optional[datetime]
    idempotency_key: str
    version: int
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "WorkerEffect":
        return cls(_s(d, "id"), _s(d, "key"), _s(d, "effect_id"), _s(d, "action_type"), _s(d, "target"),
                   d.get("payload"), _s(d, "lease_owner"), parse_time(d.get("lease_expires_at")),
                   _s(d, "idempotency_key"), _i(d, "version"), d)


@dataclass
class Step:
    """A completed step and the evidence a person can check."""

    step: str
    evidence: str

    def to_json(self) -> Dict[str, str]:
        return {"step": self.step, "evidence": self.evidence}


@dataclass
class LedgerEffect:
    """An external effect as the ledger shows it (derived by airlock, never written)."""

    effect_id: str
    action: str
    target: str
    input_hash: str
    status: str  # planned, confirmed, unknown or cleared
    receipt: str


@dataclass
class Ledger:
    """A run's work ledger: what an agent needs to resume without guessing.

    ``checkpoint_version`` is 1 on the first save and one more on each later one; a save
    is compare-and-set on it. ``invariants`` are fixed by the first save. ``effects`` is
    filled by :meth:`airlock.Client.ledger` and never sent."""

    goal: str
    invariants: List[str] = field(default_factory=list)
    completed: List[Step] = field(default_factory=list)
    pending: List[str] = field(default_factory=list)
    next_allowed_action: str = ""
    checkpoint_version: int = 0
    run_id: str = ""
    effects: List[LedgerEffect] = field(default_factory=list)

    def to_json(self, key: str) -> Dict[str, Any]:
        return {"run_id": self.run_id or key, "goal": self.goal, "invariants": list(self.invariants),
                "completed": [s.to_json() for s in self.completed], "pending": list(self.pending),
                "next_allowed_action": self.next_allowed_action, "checkpoint_version": self.checkpoint_version}

    def evidence_of(self, step: str) -> str:
        """The evidence recorded for a completed step ("" if not completed)."""
        for s in self.completed:
            if s.step == step:
                return s.evidence
        return ""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Ledger":
        return cls(goal=_s(d, "goal"), invariants=list(d.get("invariants") or []),
                   completed=[Step(_s(s, "step"), _s(s, "evidence")) for s in d.get("completed") or []],
                   pending=list(d.get("pending") or []), next_allowed_action=_s(d, "next_allowed_action"),
                   checkpoint_version=_i(d, "checkpoint_version"), run_id=_s(d, "run_id"),
                   effects=[LedgerEffect(_s(e, "effect_id"), _s(e, "action"), _s(e, "target"), _s(e, "input_hash"),
                                         _s(e, "status"), _s(e, "receipt")) for e in d.get("effects") or []])


@dataclass
class Plan:
    """airlock's answer to a plan: exactly one of these holds.

    * ``execute``: perform the effect now, then confirm it with its receipt.
    * ``confirmed``: it was performed before; do NOT perform it again. ``receipt`` is its
      receipt — empty when an operator resolved it as sent without the provider's id —
      and ``result`` the result confirmed with it, while retained.
    * ``approval``: the action is gated; the run waits for a person. Exit; after the
      approval, claim the run again and plan again.
    """

    execute: bool
    receipt: str
    result: Any
    approval: Optional[Approval]
    raw: Dict[str, Any] = field(repr=False)
    confirmed: bool = False


@dataclass
class ReconcileItem:
    """An effect planned but never confirmed: look it up before the run goes on."""

    effect_id: str
    action: str
    target: str
    input_hash: str
    run_id: str


@dataclass
class Resume:
    """airlock's verdict on how a run may go on."""

    verdict: str
    next_allowed_action: str
    checkpoint_version: int
    reconcile: List[ReconcileItem]
    reasons: List[str]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Resume":
        return cls(_s(d, "verdict"), _s(d, "next_allowed_action"), _i(d, "checkpoint_version"),
                   [ReconcileItem(_s(r, "effect_id"), _s(r, "action"), _s(r, "target"), _s(r, "input_hash"),
                                  _s(r, "run_id")) for r in d.get("reconcile") or []],
                   list(d.get("reasons") or []), d)


@dataclass
class ApprovalStatus:
    """One approval of a run as the run's explanation tells it: ``status`` is pending,
    approved, rejected, expired, cancelled or window_closed."""

    id: str
    status: str
    mode: str
    action_type: str
    target: str
    effect_id: str
    requested_by: str
    approver: str
    decided_at: Optional[datetime]
    expires_at: Optional[datetime]
    reason: str
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ApprovalStatus":
        return cls(_s(d, "id"), _s(d, "status"), _s(d, "mode"), _s(d, "action_type"), _s(d, "target"),
                   _s(d, "effect_id"), _s(d, "requested_by"), _s(d, "approver"), parse_time(d.get("decided_at")),
                   parse_time(d.get("expires_at")), _s(d, "reason"), d)


@dataclass
class PendingApproval:
    """One row of GET /v1/approvals (operator key): a pending approval, who may decide it
    and where it stands. Never its payload or its approve link's token; ``console_url``
    is the console's page of it (for signed-in people). ``undecidable_since`` is set
    while nobody known may decide it; ``warned_at`` once its expiry warning went out;
    ``escalated_at`` once ``escalation_roles`` may decide it too."""

    id: str
    key: str
    mode: str
    action_type: str
    target: str
    requested_by: str
    approver_roles: List[str]
    approver_subjects: List[str]
    escalation_roles: List[str]
    escalated_at: Optional[datetime]
    warned_at: Optional[datetime]
    undecidable_since: Optional[datetime]
    created_at: Optional[datetime]
    expires_at: Optional[datetime]
    console_url: str
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "PendingApproval":
        return cls(_s(d, "id"), _s(d, "key"), _s(d, "mode"), _s(d, "action_type"), _s(d, "target"),
                   _s(d, "requested_by"), list(d.get("approver_roles") or []), list(d.get("approver_subjects") or []),
                   list(d.get("escalation_roles") or []), parse_time(d.get("escalated_at")),
                   parse_time(d.get("warned_at")), parse_time(d.get("undecidable_since")),
                   parse_time(d.get("created_at")), parse_time(d.get("expires_at")), _s(d, "console_url"), d)


@dataclass
class ToolCall:
    """One tool call an agent or gateway handled, recorded as a tool_call event."""

    tool: str
    cls: str  # read, effect or unclassified (the API's "class")
    decision: str
    upstream: str = ""
    effect_id: str = ""
    input_hash: str = ""
    action_type: str = ""

    def to_json(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"tool": self.tool, "class": self.cls, "decision": self.decision}
        for k in ("upstream", "effect_id", "input_hash", "action_type"):
            if getattr(self, k):
                d[k] = getattr(self, k)
        return d
