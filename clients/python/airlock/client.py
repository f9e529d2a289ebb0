"""The client of airlock's HTTP API (standard library only)."""

import json
import secrets
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .canonical import hash_input
from .errors import APIError, TransportError, error_for, LeaseLostError, VersionConflictError, \
    LeaseLifetimeExceededError
from .types import (Approval, ApprovalStatus, Claim, Event, FailureDecision, Lease, Ledger, PendingApproval, Plan,
                    QueuedEffect, Resume, Run, RunEffect, ToolCall, Transition, Validation, WorkerEffect, parse_time)

if TYPE_CHECKING:
    from .steps import AgentRun

__all__ = ["Client", "LeaseKeeper", "new_idempotency_key"]

_MISSING: Any = object()

_RETRY_STATUSES = frozenset((500, 502, 503, 504))


def new_idempotency_key() -> str:
    """A fresh random Idempotency-Key (128 bits, hex)."""
    return secrets.token_hex(16)


def _run_path(key: str, *more: str) -> str:
    return "/v1/runs/" + "/".join(urllib.parse.quote(s, safe="") for s in (key,) + more)


def _effect_path(id: str, *more: str) -> str:
    return "/v1/effects/" + "/".join(urllib.parse.quote(s, safe="") for s in (id,) + more)


def _put(d: Dict[str, Any], k: str, v: Any) -> None:
    if v is not None and v is not _MISSING:
        d[k] = v


class _Answer:
    __slots__ = ("status", "body", "headers")

    def __init__(self, status: int, body: Any, headers: Dict[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = headers


class Client:
    """Calls one airlock server. Safe to share between threads.

    ``base_url`` is e.g. ``"http://127.0.0.1:8080"`` (without /v1); ``api_key`` is sent as
    ``Authorization: Bearer`` (the runs scope acts on runs, worker claims effects).

    ``retries`` is how many times a request is sent again after a transport error (no
    answer), a 5xx answer (503 store_unavailable is airlock's database out for a moment)
    or 409 request_in_progress, with growing pauses (0.2 s, 0.4 s, ...; at least the
    answer's Retry-After, at most 5 s each). A mutating request carries an
    ``Idempotency-Key``, the same on each of its retries, so airlock answers a retry of a
    request that already committed from its record instead of running it again. Every
    mutating method takes ``idempotency_key=`` to pin the key: derive it from what
    identifies the step (the run key and the step's name), and a process that restarts
    and repeats the step within 24 hours gets the first answer back.
    """

    def __init__(self, base_url: str, api_key: str = "", *, timeout: float = 30.0, retries: int = 2,
                 user_agent: str = "airlock-python") -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.retries = retries
        self.user_agent = user_agent

    # --- transport -----------------------------------------------------------

    def _once(self, method: str, path: str, data: Optional[bytes], idem: str) -> _Answer:
        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        if idem:
            headers["Idempotency-Key"] = idem
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            resp = e
        except (urllib.error.URLError, OSError, socket.timeout) as e:
            reason = getattr(e, "reason", e)
            raise TransportError(f"airlock: {method} {path}: {reason}") from e
        try:
            raw = resp.read(16 << 20)
        except (OSError, socket.timeout) as e:
            raise TransportError(f"airlock: {method} {path}: read answer: {e}") from e
        finally:
            resp.close()
        status = resp.status if hasattr(resp, "status") else resp.getcode()
        hdrs = {k.lower(): v for k, v in resp.headers.items()}
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        return _Answer(status, body, hdrs)

    def request(self, method: str, path: str, body: Any = _MISSING, *,
                idempotency_key: Optional[str] = None) -> Tuple[int, Any]:
        """Send one request (with retries) and return (status, decoded JSON body) of a 2xx
        answer; raise the :class:`APIError` subclass of the code of any other answer,
        or :class:`TransportError` when no answer came."""
        data = None
        if body is not _MISSING:
            data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        idem = ""
        if method != "GET":
            idem = idempotency_key or new_idempotency_key()
        attempt = 0
        while True:
            retry_after = 0.0
            try:
                a = self._once(method, path, data, idem)
            except TransportError:
                if attempt >= self.retries:
                    raise
            else:
                if 200 <= a.status <= 299:
                    return a.status, a.body
                try:
                    retry_after = float(int(a.headers.get("retry-after", "0")))
                except ValueError:
                    retry_after = 0.0
                err = error_for(a.status, a.body, retry_after)
                retryable = a.status in _RETRY_STATUSES or err.code == "request_in_progress"
                if not retryable or attempt >= self.retries:
                    raise err
            pause = max(0.2 * (2 ** attempt), retry_after)
            time.sleep(min(pause, 5.0))
            attempt += 1

    def _post(self, path: str, body: Any, idem: Optional[str]) -> Tuple[int, Any]:
        return self.request("POST", path, body, idempotency_key=idem)

    # --- runs ----------------------------------------------------------------

    def claim(self, key: str, payload: Any = _MISSING, *, payload_hash: Optional[str] = None,
              trigger_source: Optional[str] = None, lease_seconds: Optional[int] = None,
              meta: Optional[Dict[str, Any]] = None, idempotency_key: Optional[str] = None) -> Claim:
        """Claim ``key``: claimed (201), or not (200: a duplicate, or a run that is
        finished, parked or held by a live lease). Give ``payload`` (hashed by airlock)
        or ``payload_hash`` (see :func:`airlock.hash_input`). A different payload under
        the same key raises :class:`PayloadMismatchError`. ``lease_seconds`` is whole
        seconds (None: the server's default)."""
        body: Dict[str, Any] = {"key": key}
        _put(body, "payload", payload)
        _put(body, "payload_hash", payload_hash)
        _put(body, "trigger_source", trigger_source)
        _put(body, "lease_seconds", lease_seconds)
        _put(body, "meta", meta)
        _, out = self._post("/v1/runs/claim", body, idempotency_key)
        return Claim.from_json(out)

    def heartbeat(self, key: str, lease_owner: str, version: int, *, lease_seconds: Optional[int] = None,
                  meta: Optional[Dict[str, Any]] = None, idempotency_key: Optional[str] = None) -> Lease:
        """Extend the lease. :class:`LeaseLostError` means the lease expired or was taken
        over: this process no longer owns the run and must stop acting on it."""
        body: Dict[str, Any] = {"lease_owner": lease_owner, "version": version}
        _put(body, "lease_seconds", lease_seconds)
        _put(body, "meta", meta)
        _, out = self._post(_run_path(key, "heartbeat"), body, idempotency_key)
        return Lease.from_json(out)

    def transition(self, key: str, lease_owner: str, version: int, to: str, *, result: Any = _MISSING,
                   alert: Optional[str] = None, meta: Optional[Dict[str, Any]] = None,
                   idempotency_key: Optional[str] = None) -> Transition:
        """Move the run (compare-and-set on lease owner and version) to completed,
        failed_retryable or failed_terminal; ``result`` is stored with a terminal state
        and returned to later claims. ``alert`` (a reason, at most 200 characters; only
        with ``to="failed_terminal"``, else :class:`InvalidFieldError`) raises an alert
        ``workflow_gave_up`` with that reason: a client that gives up tells a person."""
        body: Dict[str, Any] = {"lease_owner": lease_owner, "version": version, "to": to}
        _put(body, "result", result)
        _put(body, "alert", alert)
        _put(body, "meta", meta)
        _, out = self._post(_run_path(key, "transition"), body, idempotency_key)
        return Transition.from_json(out)

    def run(self, key: str) -> Run:
        """Read the run (:class:`RunNotFoundError` if there is none)."""
        _, out = self.request("GET", _run_path(key))
        return Run.from_json(out)

    def events(self, key: str, after: int = 0, limit: int = 0) -> Tuple[List[Event], int]:
        """The run's events after the event id ``after`` (0: from the first), oldest
        first, at most ``limit`` (0: the server's default), and the ``after`` of the next
        page (0 when this was the last)."""
        q: Dict[str, str] = {}
        if after > 0:
            q["after"] = str(after)
        if limit > 0:
            q["limit"] = str(limit)
        path = _run_path(key, "events") + ("?" + urllib.parse.urlencode(q) if q else "")
        _, out = self.request("GET", path)
        return [Event.from_json(e) for e in out.get("events") or []], int(out.get("next_after") or 0)

    def validate(self, key: str, lease_owner: str, version: int, action_type: str, output: Any, *,
                 meta: Optional[Dict[str, Any]] = None, idempotency_key: Optional[str] = None) -> Validation:
        """Check a model output (a JSON value, or text holding one) against the action
        type's schema; airlock may repair it within the policy's bound. An invalid output
        is an answer (``valid`` false, ``errors``), not an exception."""
        body: Dict[str, Any] = {"lease_owner": lease_owner, "version": version, "action_type": action_type,
                                "output": output}
        _put(body, "meta", meta)
        _, out = self._post(_run_path(key, "validate"), body, idempotency_key)
        return Validation.from_json(out)

    def report_failure(self, key: str, lease_owner: str, version: int, failure_class: str, *,
                       detail: Optional[str] = None, retry_after_ms: Optional[int] = None,
                       meta: Optional[Dict[str, Any]] = None,
                       idempotency_key: Optional[str] = None) -> FailureDecision:
        """Report a failure of class ``failure_class`` (transport_timeout, rate_limited,
        server_error, client_error, parse_failure, soft_failure, partial_success,
        unknown_commit) and get the policy's decision. ``retry_after_ms`` is the
        provider's Retry-After in milliseconds."""
        body: Dict[str, Any] = {"lease_owner": lease_owner, "version": version, "class": failure_class}
        _put(body, "detail", detail)
        _put(body, "retry_after_ms", retry_after_ms)
        _put(body, "meta", meta)
        _, out = self._post(_run_path(key, "failures"), body, idempotency_key)
        return FailureDecision.from_json(out)

    def explain(self, key: str) -> Dict[str, Any]:
        """The run's explanation: processed, sent, approved, model and timeline (see
        the API's Explanation schema). Each ``answer`` is a sentence for people."""
        _, out = self.request("GET", _run_path(key, "explain"))
        return out

    def approvals(self, key: str) -> List[ApprovalStatus]:
        """Every approval of the run, with its status (from the run's explanation)."""
        ex = self.explain(key)
        return [ApprovalStatus.from_json(a) for a in (ex.get("approved") or {}).get("approvals") or []]

    def approval_status(self, key: str, approval_id: str) -> ApprovalStatus:
        """One approval of the run: ``status`` pending, approved, rejected, expired,
        cancelled or window_closed. An id the run does not have raises
        :class:`ApprovalNotFoundError`."""
        for a in self.approvals(key):
            if a.id == approval_id:
                return a
        from .errors import ApprovalNotFoundError
        raise ApprovalNotFoundError(404, "approval_not_found", f"run {key} has no approval {approval_id}")

    def list_approvals(self, *, undecidable: bool = False, after: str = "",
                       limit: int = 0) -> Tuple[List[PendingApproval], str]:
        """Pending approvals of every run, newest first (GET /v1/approvals, an operator
        key): with ``undecidable`` only those nobody known can decide. At most ``limit``
        (0: the server's default of 50; 1 to 500), after the cursor ``after`` (the
        previous page's); returns the page and the ``after`` of the next one ("" when
        this was the last)."""
        q: Dict[str, str] = {}
        if undecidable:
            q["undecidable"] = "true"
        if limit:
            q["limit"] = str(limit)
        if after:
            q["after"] = after
        path = "/v1/approvals" + ("?" + urllib.parse.urlencode(q) if q else "")
        _, out = self.request("GET", path)
        return [PendingApproval.from_json(a) for a in out.get("approvals") or []], str(out.get("next_after") or "")

    # --- effects -------------------------------------------------------------

    def queue_effect(self, key: str, lease_owner: str, version: int, action_type: str, target: str,
                     payload: Any = _MISSING, *, effect_id: Optional[str] = None, gate: Optional[str] = None,
                     meta: Optional[Dict[str, Any]] = None, idempotency_key: Optional[str] = None) -> QueuedEffect:
        """Hand an effect to airlock's outbox under the run's lease. A gated action type
        answers an ``approval`` (the run now waits for a person) instead of an effect.
        Agents that perform an effect themselves use :meth:`plan` and :meth:`confirm`."""
        body: Dict[str, Any] = {"lease_owner": lease_owner, "version": version, "action_type": action_type,
                                "target": target}
        _put(body, "payload", payload)
        _put(body, "effect_id", effect_id)
        _put(body, "gate", gate)
        _put(body, "meta", meta)
        status, out = self._post(_run_path(key, "effects"), body, idempotency_key)
        if status == 202:
            return QueuedEffect(False, int(out.get("version") or 0), None, Approval.from_json(out), "", None, out)
        eff = out.get("effect")
        return QueuedEffect(bool(out.get("created")), int(out.get("version") or 0),
                            RunEffect.from_json(eff) if eff else None, None, out.get("cancel_url") or "",
                            parse_time(out.get("not_before")), out)

    def cancel_effect(self, id: str, *, reason: str, lease_owner: Optional[str] = None,
                      idempotency_key: Optional[str] = None) -> RunEffect:
        """Withdraw a pending act_with_window effect no sender has taken (``id`` is the
        effect's airlock id, RunEffect.id). A runs key gives the run's ``lease_owner``;
        an operator key needs none."""
        body: Dict[str, Any] = {"reason": reason}
        _put(body, "lease_owner", lease_owner)
        _, out = self._post(_effect_path(id, "cancel"), body, idempotency_key)
        return RunEffect.from_json(out)

    def claim_effect(self, types: Iterable[str], *, lease_seconds: Optional[int] = None,
                     idempotency_key: Optional[str] = None) -> Optional[WorkerEffect]:
        """External worker (a worker key): lease one due effect of these action types,
        or None when none is due."""
        body: Dict[str, Any] = {"types": list(types)}
        _put(body, "lease_seconds", lease_seconds)
        status, out = self._post("/v1/effects/claim", body, idempotency_key)
        if status == 204 or not out:
            return None
        return WorkerEffect.from_json(out)

    def complete_effect(self, id: str, lease_owner: str, *, provider_id: Optional[str] = None,
                        idempotency_key: Optional[str] = None) -> RunEffect:
        """Worker: the effect happened; ``provider_id`` is the provider's id for it."""
        body: Dict[str, Any] = {"lease_owner": lease_owner}
        _put(body, "provider_id", provider_id)
        _, out = self._post(_effect_path(id, "complete"), body, idempotency_key)
        return RunEffect.from_json(out)

    def fail_effect(self, id: str, lease_owner: str, *, retryable: bool, failure_class: Optional[str] = None,
                    retry_after_ms: Optional[int] = None, idempotency_key: Optional[str] = None) -> RunEffect:
        """Worker: the effect definitely did not happen; ``retryable`` queues it again
        (after ``retry_after_ms`` milliseconds, up to the type's attempts)."""
        body: Dict[str, Any] = {"lease_owner": lease_owner, "retryable": retryable}
        _put(body, "class", failure_class)
        _put(body, "retry_after_ms", retry_after_ms)
        _, out = self._post(_effect_path(id, "fail"), body, idempotency_key)
        return RunEffect.from_json(out)

    def unknown_effect(self, id: str, lease_owner: str, *, failure_class: Optional[str] = None,
                       idempotency_key: Optional[str] = None) -> RunEffect:
        """Worker: the outcome is unknown (it may have happened); a person or a lookup
        decides, airlock never resends it by itself."""
        body: Dict[str, Any] = {"lease_owner": lease_owner}
        _put(body, "class", failure_class)
        _, out = self._post(_effect_path(id, "unknown"), body, idempotency_key)
        return RunEffect.from_json(out)

    # --- the work ledger -----------------------------------------------------

    def ledger(self, key: str) -> Ledger:
        """The run's latest ledger (:class:`LedgerNotFoundError` before the first save)."""
        _, out = self.request("GET", _run_path(key, "ledger"))
        return Ledger.from_json(out)

    def save_ledger(self, key: str, lease_owner: str, ledger: Ledger, *,
                    idempotency_key: Optional[str] = None) -> int:
        """Store ``ledger`` as the run's next checkpoint and return its checkpoint
        version. ``ledger.checkpoint_version`` must be the stored one plus 1 (1 for the
        first save): compare-and-set, so :class:`VersionConflictError` or
        :class:`LeaseLostError` means another process owns the run now. Other refusals:
        InvariantsChangedError, InvalidLedgerError (see ``errors``)."""
        body = {"lease_owner": lease_owner, "ledger": ledger.to_json(key)}
        _, out = self.request("PUT", _run_path(key, "ledger"), body, idempotency_key=idempotency_key)
        return int(out.get("checkpoint_version") or 0)

    def ledger_schema(self) -> Dict[str, Any]:
        """The JSON Schema (draft 2020-12) every saved ledger must pass."""
        _, out = self.request("GET", "/v1/ledger.schema.json")
        return out

    def plan(self, key: str, effect_id: str, lease_owner: str, action: str, target: str, input_hash: str = "", *,
             input: Any = _MISSING, meta: Optional[Dict[str, Any]] = None,
             idempotency_key: Optional[str] = None) -> Plan:
        """Record the intent to perform ``effect_id`` before performing it. ``input`` is
        what the effect will do (any JSON): a gated action's approval card shows it to the
        person who decides, and the approval is bound to it (its hash is computed when
        ``input_hash`` is not given; the privacy allow-list and payload retention apply to
        it as to any payload). Give ``input_hash`` alone to keep the input to yourself.

        The answer is a :class:`Plan`: ``execute``, ``confirmed`` (performed before:
        ``receipt``, empty when an operator resolved it as sent without the provider's
        id) or ``approval``. Refusals: ReconcileFirstError (a previous attempt stopped
        between plan and confirm: search the external system, then :meth:`reconcile`),
        InputMismatchError (the same id with other input: stop), ActionsDisabledError
        (the kill switch), UnknownActionTypeError, LeaseLostError."""
        if input is not _MISSING and not input_hash:
            input_hash = hash_input(input)
        if not input_hash:
            raise ValueError("plan: give input, or its input_hash")
        body: Dict[str, Any] = {"lease_owner": lease_owner, "action": action, "target": target,
                                "input_hash": input_hash}
        _put(body, "input", input)
        _put(body, "meta", meta)
        status, out = self._post(_run_path(key, "ledger", "effects", effect_id, "plan"), body, idempotency_key)
        if status == 202:
            return Plan(False, "", None, Approval.from_json(out), out, False)
        execute = bool(out.get("execute"))
        confirmed = bool(out.get("confirmed")) or (not execute and bool(out.get("receipt")))
        if not execute and not confirmed:
            raise APIError(status, "", f"plan {effect_id}: neither execute nor confirmed in the answer")
        return Plan(execute, out.get("receipt") or "", out.get("result"), None, out, confirmed)

    def confirm(self, key: str, effect_id: str, lease_owner: str, receipt: str, *, result: Any = _MISSING,
                idempotency_key: Optional[str] = None) -> None:
        """Record that the planned effect happened, with the external system's id (or
        another checkable reference) as ``receipt``; ``result`` (any JSON, at most
        256 KiB) is answered to a later plan of the same effect."""
        body: Dict[str, Any] = {"lease_owner": lease_owner, "receipt": receipt}
        _put(body, "result", result)
        self._post(_run_path(key, "ledger", "effects", effect_id, "confirm"), body, idempotency_key)

    def reconcile(self, key: str, effect_id: str, lease_owner: str, found: Optional[List[str]] = None, *,
                  undetermined: bool = False, idempotency_key: Optional[str] = None) -> str:
        """Report what a search of the external system found for a planned effect: the
        receipts of the matching records, or ``undetermined`` when the search could not
        decide. Returns the effect's new status: cleared (nothing found: plan again),
        confirmed (exactly one) or unknown (several, or undetermined: a person decides)."""
        body: Dict[str, Any] = {"lease_owner": lease_owner}
        if undetermined:
            body["undetermined"] = True
        else:
            body["found"] = list(found or [])
        _, out = self._post(_run_path(key, "ledger", "effects", effect_id, "reconcile"), body, idempotency_key)
        return str(out.get("status") or "")

    def resume(self, key: str) -> Resume:
        """How the run may go on. Call it after every claim, before acting."""
        _, out = self.request("GET", _run_path(key, "resume"))
        return Resume.from_json(out)

    def record_tool_call(self, key: str, call: ToolCall, *, idempotency_key: Optional[str] = None) -> None:
        """Write ``call`` as a tool_call event on the run (no lease needed)."""
        self._post(_run_path(key, "ledger", "calls"), call.to_json(), idempotency_key)

    # --- the step API --------------------------------------------------------

    def open_run(self, key: str, payload: Any, *, goal: Optional[str] = None, steps: Sequence[str] = (),
                 invariants: Sequence[str] = (), lease_seconds: int = 30, wait_lease: Optional[float] = None,
                 wait_approval: float = 0.0, poll: float = 1.0,
                 meta: Optional[Dict[str, Any]] = None) -> "AgentRun":
        """Claim the run ``key`` and keep it: an :class:`airlock.AgentRun` whose
        :meth:`~airlock.AgentRun.step` performs each side effect at most once.

        A run held by another process's live lease (one that crashed a moment ago) is
        waited out for up to ``wait_lease`` seconds (default: ``lease_seconds`` + 5),
        then :class:`RunBusyError`. A run waiting for a person is waited on for up to
        ``wait_approval`` seconds (default 0: not at all), then
        :class:`ApprovalPendingError` (with the approval's console link); a rejected run
        raises :class:`RejectedError` with the approver's reason; a finished run opens
        with ``finished`` set. The lease (``lease_seconds``) is renewed every third of it
        from a thread; the first start saves the ledger (``goal``, ``invariants``, the
        declared ``steps`` as pending)."""
        from .steps import AgentRun
        run = AgentRun(self, key, payload, goal=goal or f"run {key}", steps=steps, invariants=invariants,
                       lease_seconds=lease_seconds,
                       wait_lease=float(lease_seconds + 5) if wait_lease is None else wait_lease,
                       wait_approval=wait_approval, poll=poll, meta=meta)
        return run._open()

    # --- leases --------------------------------------------------------------

    def keep_lease(self, claim: Union[Claim, Tuple[str, str, int]], lease_seconds: int, *,
                   interval: Optional[float] = None) -> "LeaseKeeper":
        """A context manager that heartbeats the claimed run every ``interval`` seconds
        (a third of ``lease_seconds`` by default) until the block ends or the lease is
        lost; see :class:`LeaseKeeper`."""
        if isinstance(claim, Claim):
            if not claim.claimed:
                raise ValueError(f"keep_lease: run {claim.key} was not claimed by this process")
            key, owner, version = claim.key, claim.lease_owner, claim.version
        else:
            key, owner, version = claim
        return LeaseKeeper(self, key, owner, version, lease_seconds, interval)


class LeaseKeeper:
    """Keeps a run's lease alive from a background thread::

        with client.keep_lease(claim, lease_seconds=30) as lease:
            for step in steps:
                lease.check()          # raises LeaseLostError once a heartbeat found it gone
                lease.verify()         # right before an external effect: asks airlock now
                do(step)

    A heartbeat answered lease_lost, version_conflict or lease_lifetime_exceeded stops
    the thread and marks the lease lost: ``lost`` is set, ``error`` holds the answer and
    :meth:`check` raises it; the process no longer owns the run and must not act on it
    (its next mutating call would be refused too). Other failures (no answer, 503) are
    retried at the next tick while the lease may still be live. Leaving the block stops
    the heartbeats; a transition ends the lease anyway.
    """

    def __init__(self, client: Client, key: str, lease_owner: str, version: int, lease_seconds: int,
                 interval: Optional[float] = None) -> None:
        if lease_seconds < 1:
            raise ValueError("lease_seconds must be at least 1")
        self.client = client
        self.key = key
        self.lease_owner = lease_owner
        self.version = version
        self.lease_seconds = lease_seconds
        self.interval = interval if interval is not None else lease_seconds / 3.0
        self.lost = threading.Event()
        self.error: Optional[APIError] = None
        self.last: Optional[Lease] = None
        self.beats = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        # One try per tick, waiting at most the lease (an answer after the lease ended would
        # be moot); the next tick is the retry, while the lease may still be live.
        self._client = Client(client.base_url, client.api_key, timeout=float(lease_seconds), retries=0,
                              user_agent=client.user_agent)

    def __enter__(self) -> "LeaseKeeper":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"airlock-lease-{self.key}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def check(self) -> None:
        """Raise the lease's loss (LeaseLostError, ...) if it was lost. It reads only what
        the last heartbeat learnt: after a pause (GC, SIGSTOP, a laptop lid) it can pass
        while the lease is already gone. Right before acting, call :meth:`verify`."""
        if self.lost.is_set() and self.error is not None:
            raise self.error

    def verify(self) -> Lease:
        """Ask airlock now whether this process still holds the lease: a heartbeat, which
        also renews it for ``lease_seconds``. Returns the renewed lease; raises the loss
        (LeaseLostError, ...) and marks the lease lost when it is gone, or the request's
        error when airlock did not answer (then do not act either). Call it right before
        each external effect, after ``plan`` answered execute."""
        self.check()
        try:
            lease = self._client.heartbeat(self.key, self.lease_owner, self.version, lease_seconds=self.lease_seconds)
        except (LeaseLostError, VersionConflictError, LeaseLifetimeExceededError) as e:
            self._lose(e)
            raise
        self.last = lease
        self.beats += 1
        return lease

    def _lose(self, e: APIError) -> None:
        self.error = e
        self.lost.set()
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.last = self._client.heartbeat(self.key, self.lease_owner, self.version, lease_seconds=self.lease_seconds)
                self.beats += 1
            except (LeaseLostError, VersionConflictError, LeaseLifetimeExceededError) as e:
                self._lose(e)
                return
            except Exception:  # noqa: BLE001 - no answer or an outage: try again next tick
                continue
