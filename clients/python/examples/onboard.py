"""Onboard a customer: three side effects, one of them gated, each done exactly once however
often this process is killed. Usage: onboard.py RUN_KEY PROVIDER_DIR (AIRLOCK_URL, AIRLOCK_API_KEY)."""
import json, os, sys, time
import airlock

c = airlock.Client(os.environ["AIRLOCK_URL"], os.environ["AIRLOCK_API_KEY"])
key, provider = sys.argv[1], sys.argv[2]  # the run; a directory playing the external system


def write(call):  # the external system: one record per call; the receipt is its id
    rid = f"{call.action}-{time.time_ns()}"
    with open(os.path.join(provider, rid), "w") as f:
        json.dump({"run": call.key, "effect": call.effect_id, "input": call.input}, f)
    return rid


def find(call):  # its search: the ids of the records this effect may have left
    def mine(rid):
        with open(os.path.join(provider, rid)) as f:
            r = json.load(f)
        return (r["run"], r["effect"]) == (call.key, call.effect_id)
    return [rid for rid in sorted(os.listdir(provider)) if mine(rid)]


try:
    with c.open_run(key, {"customer": "alice"}, goal="Onboard alice", steps=["draft", "crm", "share"],
                    lease_seconds=2, wait_approval=float(os.environ.get("WAIT_APPROVAL", "0"))) as run:
        if not run.finished:
            doc = run.step("draft", "create_doc", "docs", {"title": "Welcome, Alice"}, write, find)
            run.step("crm", "crm_note", "crm", {"customer": "alice", "note": "onboarding"}, write, find)
            run.step("share", "share_doc", "team", {"doc": doc.receipt, "with": "alice@example.com"}, write, find)
            run.complete({"doc": doc.receipt})
        print(json.dumps({"state": "completed", "result": run.result}))
except airlock.ApprovalPendingError as e:
    sys.exit(f"waiting for approval {e.approval_id}: {e.approve_url or e.console_url}")
except airlock.RejectedError as e:
    sys.exit(f"rejected by {e.rejected_by}: {e.reason}")
