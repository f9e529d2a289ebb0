// Package alerts raises alerts from their committed events. An alert is an event on the
// key (kind "alert", detail {"alert": kind, …}); a trigger copies each such event into the
// alert outbox in the transaction that writes it (0026_alert_outbox.sql), and the Relay
// raises every outbox row through an Alerter (the warn log line and
// airlock_alerts_total{kind}) and deletes it, in one transaction.
//
// Delivery is at least once: the raise happens before the delete commits, so a lost
// commit reply or a crash there raises the alert again, from this instance or another;
// it is never lost. Each raise carries the event's id as event_id, for a receiver to
// de-duplicate on. Code that commits an alert calls Wake, so the alert is raised at once;
// Run polls as a backstop (an alert committed by another instance, by a command line
// process, or inside a transaction that committed after the wake).
package alerts

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/periodic"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// PollInterval is how often Run looks at the outbox without being woken.
const PollInterval = time.Second

// batch is how many rows one transaction of Drain raises at most.
const batch = 100

// Relay raises the alert outbox's rows through an Alerter. One per process; several
// relays on one PostgreSQL share the outbox (each row is raised by one of them, barring a
// lost commit).
type Relay struct {
	store store.Store
	sink  runs.Alerter
	log   *slog.Logger

	mu      sync.Mutex
	running chan struct{} // closed when the background drain Wake started ends; nil: none
	again   bool          // woken while that drain ran
}

// Config is what the relay needs beside its Base.
type Config struct {
	// Alerter raises each committed alert (metrics.Alerter: the log line and the counter)
	// (required).
	Alerter runs.Alerter
}

// New returns a relay of b.Store's alert outbox into cfg.Alerter; b.Log gets the relay's
// own failures. The relay is what the other services' Base.Alerts wakes, so its own Base
// needs none.
func New(b runs.Base, cfg Config) (*Relay, error) {
	b, err := b.Fill()
	if err != nil {
		return nil, fmt.Errorf("alerts: %w", err)
	}
	if cfg.Alerter == nil {
		return nil, errors.New("alerts: Config.Alerter is required")
	}
	return &Relay{store: b.Store, sink: cfg.Alerter, log: b.Log}, nil
}

// Wake raises the outbox's alerts in the background, now: called after a commit that
// wrote alert events. It never blocks its caller, and never joins the caller's
// transaction (a Within's ctx is not passed on): an alert written in a transaction that
// has not committed yet is raised by the next wake or poll. Wakes during a drain make one
// more drain after it.
func (r *Relay) Wake() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running != nil {
		r.again = true
		return
	}
	done := make(chan struct{})
	r.running = done
	go r.background(done)
}

func (r *Relay) background(done chan struct{}) {
	defer close(done)
	for {
		if _, err := r.Drain(context.Background()); err != nil {
			r.log.Warn("alert relay failed; the alerts stay in the outbox for the next attempt", "err", err)
		}
		r.mu.Lock()
		if !r.again {
			r.running = nil
			r.mu.Unlock()
			return
		}
		r.again = false
		r.mu.Unlock()
	}
}

// Flush waits for a background drain to end, then drains: an alert committed before
// Flush was called has been raised (by this relay, or by another that holds its row and
// is raising it now) when it returns nil.
func (r *Relay) Flush(ctx context.Context) error {
	r.mu.Lock()
	done := r.running
	r.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	_, err := r.Drain(ctx)
	return err
}

// Run drains the outbox every interval (0: PollInterval) until ctx ends.
func (r *Relay) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = PollInterval
	}
	periodic.Every(ctx, interval, func(ctx context.Context) error { _, err := r.Drain(ctx); return err }, func(err error) {
		r.log.Warn("alert relay failed; the alerts stay in the outbox for the next attempt", "err", err)
	})
}

// Drain raises the outbox's rows, a batch per transaction, until it finds none it can
// take, and returns how many it raised. In each transaction it takes the rows, deletes
// them and raises them, then commits: a commit that fails or whose reply is lost leaves
// the rows to be raised again (at least once).
func (r *Relay) Drain(ctx context.Context) (int, error) {
	total := 0
	for {
		n := 0
		err := r.store.Transact(ctx, func(q store.Queries) error {
			n = 0 // Transact may run this again
			evs, err := q.AlertOutboxTake(ctx, batch)
			if err != nil || len(evs) == 0 {
				return err
			}
			ids := make([]int64, len(evs))
			for i, e := range evs {
				ids[i] = e.ID
			}
			if err := q.AlertOutboxDelete(ctx, ids); err != nil {
				return err
			}
			for _, e := range evs {
				r.raise(ctx, e)
			}
			n = len(evs)
			return nil
		})
		total += n
		if err != nil {
			return total, fmt.Errorf("relay alerts: %w", err)
		}
		if n < batch {
			return total, nil
		}
	}
}

// raise raises one outbox row: its kind is the detail's "alert", its fields the
// detail's other members (by name), then event_id.
func (r *Relay) raise(ctx context.Context, e store.Event) {
	kind, attrs := Decode(e.Detail)
	attrs = append(attrs, slog.Int64("event_id", e.ID))
	r.sink.Alert(ctx, kind, e.RunKey, attrs...)
}

// Decode splits an alert event's detail into its kind and its other fields as log
// attributes, ordered by name. Whole numbers are integers, as the code that wrote the
// event logged them. A detail that does not decode is kind "unknown" with the raw detail.
func Decode(detail json.RawMessage) (string, []slog.Attr) {
	var fields map[string]any
	dec := json.NewDecoder(bytes.NewReader(detail))
	dec.UseNumber()
	if err := dec.Decode(&fields); err != nil {
		return "unknown", []slog.Attr{slog.String("detail", string(detail))}
	}
	kind, _ := fields["alert"].(string)
	if kind == "" {
		kind = "unknown"
	}
	names := make([]string, 0, len(fields))
	for k := range fields {
		if k != "alert" {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	attrs := make([]slog.Attr, 0, len(names)+1)
	for _, k := range names {
		attrs = append(attrs, attr(k, fields[k]))
	}
	return kind, attrs
}

func attr(k string, v any) slog.Attr {
	switch v := v.(type) {
	case string:
		return slog.String(k, v)
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return slog.Int64(k, i)
		}
		if f, err := v.Float64(); err == nil && !math.IsInf(f, 0) {
			return slog.Float64(k, f)
		}
		return slog.String(k, v.String())
	case bool:
		return slog.Bool(k, v)
	}
	return slog.Any(k, v)
}

// Polled is the AlertWaker of a process that runs no relay (an operator command): the
// alerts it commits are raised by the relays of the serving instances at their next poll,
// and counted in their airlock_alerts_total, which is what gets scraped.
type Polled struct{}

func (Polled) Wake() {}
