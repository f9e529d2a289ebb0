"""airlock: a client of airlock's HTTP API for agents written in Python.

Standard library only (urllib, json, hashlib), Python 3.9+. The flow of a long-running
agent that must survive being stopped:

1. Claim the run's key (:meth:`Client.claim`); ``claimed`` gives a lease_owner, the
   capability to act on the run until the lease expires. Keep the lease alive with
   :meth:`Client.keep_lease` while working.
2. Ask for the resume verdict (:meth:`Client.resume`) and follow it: continue,
   reconcile (search the external system for planned effects, :meth:`Client.reconcile`),
   wait (an approval is pending) or stop (a person decides).
3. Around every external effect: :meth:`Client.plan` before, perform it, then
   :meth:`Client.confirm` with the external system's id as receipt. The input hash comes
   from :func:`hash_input` (RFC 8785 + SHA-256, the server's own hash).
4. After every step, :meth:`Client.save_ledger` with checkpoint_version + 1.
5. At the end, :meth:`Client.transition` the run to "completed".

The step API does steps 1-5 for the agent: :meth:`Client.open_run` claims and keeps the
run, :meth:`AgentRun.step` plans, performs, confirms, reconciles and records each side
effect, :meth:`AgentRun.complete` ends the run.

Errors are :class:`APIError` subclasses named for their code (``LeaseLostError`` for
lease_lost, ``ReconcileFirstError`` for reconcile_first, ...).
"""

from .canonical import canonical_json, hash_input, number_to_json
from .client import Client, LeaseKeeper, new_idempotency_key
from .steps import DONE, AgentRun, StepCall, StepResult
from .errors import *  # noqa: F401,F403 - one class per error code
from .errors import __all__ as _errors_all
from .types import *  # noqa: F401,F403
from .types import __all__ as _types_all

__version__ = "0.1.0"

__all__ = ["Client", "LeaseKeeper", "AgentRun", "StepCall", "StepResult", "DONE", "new_idempotency_key", "canonical_json", "hash_input", "number_to_json",
           "__version__"] + list(_errors_all) + list(_types_all)
