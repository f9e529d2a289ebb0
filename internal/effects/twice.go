package effects

// Evidence of a second performance: a report that arrives when airlock's record says the
// effect was (or is about to be) performed by someone else.

import (
	"context"
	"encoding/json"
	"time"

	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// PerformedTwiceAlert is the alert kind of a second performance.
const PerformedTwiceAlert = "performed_twice"

// Sources of a second performance's evidence.
const (
	SourceConfirm      = "confirm"       // an agent's ledger confirm
	SourceWorkerReport = "worker_report" // an external worker's completion report
)

// SecondPerformance is the evidence that an effect was performed by a caller whose report
// airlock refused — a holder whose lease was lost, a worker whose lease lapsed — while the
// record holds another performance (State completed, Receipt its receipt) or another
// holder's intent to perform it (State planned, or pending: cleared to run again).
type SecondPerformance struct {
	RunKey      string
	EffectID    string
	State       store.EffectState // the effect's state, which the report did not change
	Receipt     string            // the receipt on record ("" when none yet)
	LateReceipt string            // the refused report's receipt
	Source      string
}

// performedTwiceDetail is the alert event's detail.
type performedTwiceDetail struct {
	Alert       string            `json:"alert"`
	EffectID    string            `json:"effect_id"`
	LateReceipt string            `json:"late_receipt"`
	Receipt     *string           `json:"receipt,omitempty"`
	Source      string            `json:"source"`
	State       store.EffectState `json:"state"`
}

// RecordPerformedTwice writes the alert event of p on its run in q's transaction, unless
// one for the same effect and late receipt is already there: a retried or repeated report
// alerts once. It changes nothing else: the refused report is evidence, not a write. The
// caller raises the alert after the commit (RaisePerformedTwice) when written is true.
func RecordPerformedTwice(ctx context.Context, q store.Queries, now *time.Time, p SecondPerformance) (written bool, err error) {
	// The run's lock orders two reports of the same receipt: the second sees the first's event.
	if _, err := q.RunLockKeys(ctx, []string{p.RunKey}); err != nil {
		return false, err
	}
	var after int64
	for {
		evs, err := q.EventList(ctx, p.RunKey, after, 1000)
		if err != nil {
			return false, err
		}
		for _, ev := range evs {
			if ev.Kind != string(store.EventAlert) {
				continue
			}
			var d performedTwiceDetail
			if json.Unmarshal(ev.Detail, &d) == nil && d.Alert == PerformedTwiceAlert &&
				d.EffectID == p.EffectID && d.LateReceipt == p.LateReceipt {
				return false, nil
			}
		}
		if len(evs) < 1000 {
			break
		}
		after = evs[len(evs)-1].ID
	}
	d := performedTwiceDetail{Alert: PerformedTwiceAlert, EffectID: p.EffectID, LateReceipt: p.LateReceipt,
		Source: p.Source, State: p.State}
	if p.State == store.EffectCompleted {
		d.Receipt = &p.Receipt
	}
	detail, err := json.Marshal(d)
	if err != nil {
		return false, err
	}
	_, err = q.EventInsert(ctx, store.EventInsertParams{RunKey: p.RunKey, Kind: string(store.EventAlert), Actor: "airlock",
		Detail: detail, Now: now})
	return err == nil, err
}

// RaisePerformedTwice wakes the alert relay after p's event has committed: the relay
// raises it from the event (internal/alerts), at least once.
func RaisePerformedTwice(alerts runs.AlertWaker) {
	alerts.Wake()
}
