package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ClaimParams is a whole claim: the claim statement and the events it owes.
type ClaimParams struct {
	RunClaimParams
	Actor string          // recorded on the claim's event
	Meta  json.RawMessage // the client's meta, recorded on the claim's event (nil: none)
	// AlertAfter: a reclaim that brings the run's reclaims above this also writes an
	// "alert" event (lease_reclaims).
	AlertAfter int64
	// Refusing, when set, is called between a claim statement that matched nothing and
	// the statement that records the refusal (tests force the interleaving with it).
	Refusing func()
}

// ClaimOutcome is what a claim did.
type ClaimOutcome struct {
	// Run is the run after the claim; when refused, as stored (its duplicate counted).
	Run Run
	// Claimed: the caller holds a fresh lease (Run.Reclaims > 0: taken over).
	Claimed bool
	// Mismatch: refused because the key is stored with another payload hash; nothing
	// but the payload_mismatch event was written.
	Mismatch bool
	// Alerted: the reclaim crossed AlertAfter and an alert event was written.
	Alerted bool
}

// Reclaimed reports whether the claim took the run over from an earlier owner.
func (o ClaimOutcome) Reclaimed() bool { return o.Claimed && o.Run.Reclaims > 0 }

// ClaimSequence is the claim as a fixed sequence of statements, for a caller that holds a
// transaction: the claim statement; for a new run, the replacement it continues (the
// rerun protocol's link); when refused, the duplicate count; and the events:
//
//	claimed          {payload_hash, lease_expires_at[, replaces, provider_ids]}
//	lease_reclaimed  {payload_hash, lease_expires_at, reclaims}
//	alert            {alert: lease_reclaims, reclaims, threshold} (actor airlock), past AlertAfter
//	duplicate        {state, duplicates} (version 0)
//	payload_mismatch {payload_hash, stored_payload_hash} (version 0)
//
// A backend's single-statement claim must write exactly these (the conformance suite
// compares them across backends).
func ClaimSequence(ctx context.Context, q Queries, p ClaimParams) (ClaimOutcome, error) {
	event := func(kind EventKind, version int64, actor string, meta json.RawMessage, detail map[string]any) error {
		d, err := json.Marshal(detail)
		if err != nil {
			return err
		}
		_, err = q.EventInsert(ctx, EventInsertParams{RunKey: p.Key, Kind: string(kind), Version: version,
			Actor: actor, Meta: meta, Detail: d, Now: p.Now})
		return err
	}
	run, err := q.RunClaim(ctx, p.RunClaimParams)
	switch {
	case err == nil:
		out := ClaimOutcome{Run: run, Claimed: true}
		kind, detail := EventClaimed, map[string]any{"payload_hash": run.PayloadHash, "lease_expires_at": EventTime(run.LeaseExpiresAt)}
		if out.Reclaimed() {
			kind = EventLeaseReclaimed
			detail["reclaims"] = run.Reclaims
		} else if r, err := q.ReplacementFind(ctx, run.Key, true); err == nil {
			detail["replaces"], detail["provider_ids"] = r.OldKey, r.ProviderIDs
		} else if !errors.Is(err, ErrNotFound) {
			return ClaimOutcome{}, err
		}
		if err := event(kind, run.Version, p.Actor, p.Meta, detail); err != nil {
			return ClaimOutcome{}, err
		}
		if out.Reclaimed() && run.Reclaims > p.AlertAfter {
			out.Alerted = true
			err = event(EventAlert, run.Version, "airlock", nil,
				map[string]any{"alert": "lease_reclaims", "reclaims": run.Reclaims, "threshold": p.AlertAfter})
		}
		return out, err
	case errors.Is(err, ErrNoMatch):
		if p.Refusing != nil {
			p.Refusing()
		}
		run, err := q.RunRefuse(ctx, p.Key, p.PayloadHash)
		if err != nil {
			return ClaimOutcome{}, fmt.Errorf("record refused claim: %w", err)
		}
		if run.PayloadHash != p.PayloadHash {
			return ClaimOutcome{Run: run, Mismatch: true}, event(EventPayloadMismatch, 0, p.Actor, p.Meta,
				map[string]any{"payload_hash": p.PayloadHash, "stored_payload_hash": run.PayloadHash})
		}
		return ClaimOutcome{Run: run}, event(EventDuplicate, 0, p.Actor, p.Meta,
			map[string]any{"state": run.State, "duplicates": run.Duplicates})
	default:
		return ClaimOutcome{}, fmt.Errorf("claim: %w", err)
	}
}

// EventTime is how events spell a time: UTC, RFC 3339 with as many fractional digits as
// needed (what encoding/json writes for a UTC time.Time).
func EventTime(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UTC().Format(time.RFC3339Nano)
}
