package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// ChainCheck is what `airlock audit verify` found for one run's hash chain
// (store/chain.go). Field names are a stable contract for --json.
type ChainCheck struct {
	Key string `json:"key"`
	OK  bool   `json:"ok"`
	// Events counts the run's events read; Chained those with a link that were checked.
	Events  int `json:"events"`
	Chained int `json:"chained"`
	// Unchained counts the events written before the run's chain began (before the
	// migration that added it): nothing proves them. UnchainedBefore is the first chained
	// event's id, the point from which the chain proves the record.
	Unchained       int   `json:"unchained"`
	UnchainedBefore int64 `json:"unchained_before,omitempty"`
	// Purged is the last link retention deleted: the checked chain starts after it.
	Purged int64 `json:"purged,omitempty"`
	// Seq and Head are the run's head: its last link and hash.
	Seq  int64  `json:"seq,omitempty"`
	Head string `json:"head,omitempty"`
	// Problem says what is wrong, BadEventID the first event where the chain breaks (0
	// when the break is past the last event, or the head itself is missing).
	Problem    string `json:"problem,omitempty"`
	BadEventID int64  `json:"bad_event_id,omitempty"`
	// Keyed counts the events whose MAC was checked and holds (store/mac.go); Unkeyed
	// those written without a key (before one was configured); MACsUnchecked those that
	// carry a MAC verify was given no key for (no --key-file, no AIRLOCK_AUDIT_KEY_FILE).
	Keyed         int `json:"keyed"`
	Unkeyed       int `json:"unkeyed"`
	MACsUnchecked int `json:"macs_unchecked,omitempty"`
	// Checkpointed is the link the checkpoint held the chain to (0: not in it).
	Checkpointed int64 `json:"checkpointed,omitempty"`
}

// VerifyOptions are what verify checks beyond the chain.
type VerifyOptions struct {
	// Keys are the audit keys (the current one and those kept from before a rotation):
	// with any, every event's MAC is checked.
	Keys store.Keyring
	// RequireMAC fails a run with any unkeyed event.
	RequireMAC bool
	// KeyedSince is the first event id written with a MAC anywhere (0: none): an event
	// without one after it was written around airlock (ChainFirstKeyed).
	KeyedSince int64
	// Checkpoints, when set, are every signed checkpoint of a directory
	// (LoadCheckpoints): each run must still hold every head any of them recorded — at
	// that link with that hash, or past it — and its base. Checkpoint is one checkpoint
	// alone, used when Checkpoints is not set.
	Checkpoints *CheckpointSet
	Checkpoint  *Checkpoint
	// Retention is how long events are kept (the policy's retention.events; 0: not
	// checked): a retention base whose link is younger than Now - Retention was not moved
	// by retention.
	Retention time.Duration
	Now       time.Time
	ix        *checkpointed
}

func (o VerifyOptions) prepared() VerifyOptions {
	if o.ix == nil {
		if o.Checkpoints != nil {
			o.ix = o.Checkpoints.ix
		} else {
			o.ix = indexCheckpoint(o.Checkpoint)
		}
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	return o
}

// chainPage bounds one read of a run's events.
const chainPage = 1000

// VerifyChain checks one run's hash chain: every link from the first (or from the last
// one retention deleted) to the head, each event's hash recomputed from the stored
// previous hash and its stored content. A run with no events is runs.ErrNotFound-like:
// ErrNoEvents.
func (s *Service) VerifyChain(ctx context.Context, key string) (ChainCheck, error) {
	return s.VerifyChainWith(ctx, key, VerifyOptions{})
}

// VerifyChainWith is VerifyChain with the options: each event's MAC is checked too.
//
// The run's head and events are read in one snapshot (store.ChainSnapshot): a purge
// committing meanwhile is either wholly seen or not at all.
func (s *Service) VerifyChainWith(ctx context.Context, key string, opt VerifyOptions) (c ChainCheck, err error) {
	opt = opt.prepared()
	err = s.store.ChainSnapshot(ctx, func(q store.ChainQueries) (err error) {
		c, err = verifyChain(ctx, q, key, opt)
		return err
	})
	return c, err
}

func verifyChain(ctx context.Context, q store.ChainQueries, key string, opt VerifyOptions) (ChainCheck, error) {
	c := ChainCheck{Key: key}
	// The head first: a link written after it (seq > head) is left for the next check,
	// and every link up to it committed with the head, so it is there to read.
	head, err := q.ChainHeadGet(ctx, key)
	hasHead := err == nil
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return c, fmt.Errorf("verify %q: %w", key, err)
	}
	var chained []store.ChainEvent
	var unchained []store.ChainEvent
	for after := int64(0); ; {
		page, err := q.ChainEvents(ctx, key, after, chainPage)
		if err != nil {
			return c, fmt.Errorf("verify %q: %w", key, err)
		}
		for _, e := range page {
			switch {
			case e.Seq == nil || e.Hash == nil:
				unchained = append(unchained, e)
			case !hasHead || *e.Seq <= head.Seq:
				chained = append(chained, e)
			}
			c.Events++
		}
		if len(page) < chainPage {
			break
		}
		after = page[len(page)-1].ID
	}
	var states []checkpointState
	if opt.ix != nil {
		states = opt.ix.runs[key]
	}
	inCheckpoint := len(states) > 0
	var cp checkpointState // the newest state recorded, for what a wiped run had
	for _, s := range states {
		if s.at.After(cp.at) || s.at.Equal(cp.at) && s.Seq > cp.Seq {
			cp = s
		}
	}
	if c.Events == 0 && !hasHead {
		if inCheckpoint {
			c.Problem = fmt.Sprintf("the run's events and chain head are gone, but the checkpoint of %s has its head at link %d (%s): the run was wiped",
				cp.at.Format(time.RFC3339), cp.Seq, short(cp.Head))
			return c, nil
		}
		return c, ErrNoEvents
	}
	slices.SortStableFunc(chained, func(a, b store.ChainEvent) int {
		if *a.Seq != *b.Seq {
			return int(min(max(*a.Seq-*b.Seq, -1), 1))
		}
		return int(min(max(a.ID-b.ID, -1), 1))
	})
	fail := func(id int64, format string, args ...any) (ChainCheck, error) {
		c.OK, c.BadEventID, c.Problem = false, id, fmt.Sprintf(format, args...)
		return c, nil
	}
	if hasHead {
		c.Seq, c.Head, c.Purged = head.Seq, head.Head, head.BaseSeq
	}
	if len(chained) > 0 {
		c.UnchainedBefore = slices.MinFunc(chained, func(a, b store.ChainEvent) int { return int(min(max(a.ID-b.ID, -1), 1)) }).ID
	}
	for _, e := range unchained {
		if len(chained) > 0 && e.ID > c.UnchainedBefore {
			return fail(e.ID, "event %d (%s) has no link although the run's chain began at event %d: it was written around the chain (trigger bypassed) or its link was erased",
				e.ID, e.Kind, c.UnchainedBefore)
		}
		c.Unchained++
	}
	if !hasHead {
		if inCheckpoint {
			return fail(0, "the run's chain head is gone, but the checkpoint of %s has it at link %d (%s)", cp.at.Format(time.RFC3339), cp.Seq, short(cp.Head))
		}
		if len(chained) > 0 {
			return fail(chained[0].ID, "the run's chain head is missing, but event %d carries link %d", chained[0].ID, *chained[0].Seq)
		}
		if ok, id, problem := checkMACs(&c, nil, unchained, opt); !ok {
			return fail(id, "%s", problem)
		}
		c.OK = true // every event predates the chain
		return c, nil
	}
	if ok, id, problem := checkMACs(&c, chained, unchained, opt); !ok {
		return fail(id, "%s", problem)
	}
	prev, want := head.BaseHash, head.BaseSeq+1
	for _, e := range chained {
		if *e.Seq < want {
			if *e.Seq <= head.BaseSeq {
				continue // kept by retention though older links went: the chain resumes after the base
			}
			return fail(e.ID, "event %d (%s) repeats link %d", e.ID, e.Kind, *e.Seq)
		}
		if *e.Seq > want {
			return fail(e.ID, "link %d is missing before event %d (%s, link %d): an event was deleted", want, e.ID, e.Kind, *e.Seq)
		}
		if got := store.ChainHash(prev, e); got != *e.Hash {
			return fail(e.ID, "event %d (%s, link %d) does not match its hash: its content, its id or its place in the chain was changed", e.ID, e.Kind, *e.Seq)
		}
		prev, want = *e.Hash, want+1
		c.Chained++
	}
	if want-1 != head.Seq {
		last := int64(0)
		if len(chained) > 0 {
			last = chained[len(chained)-1].ID
		}
		return fail(0, "the chain's head is link %d but the last link found is %d (after event %d): the events after it were deleted", head.Seq, want-1, last)
	}
	if prev != head.Head {
		return fail(0, "the chain's head hash differs from the last event's: the head or the last event was changed")
	}
	if problem := checkBase(head, opt); problem != "" {
		return fail(0, "%s", problem)
	}
	// Every recorded state, not only the newest: a rollback to a state between two
	// checkpoints, followed by new events, agrees with the checkpoints written after it
	// but not with those written before it that saw the links it replaced.
	for _, s := range states {
		if id, problem := checkCheckpoint(head, chained, s); problem != "" {
			return fail(id, "%s", problem)
		}
		c.Checkpointed = max(c.Checkpointed, s.Seq)
	}
	c.OK = true
	return c, nil
}

// checkBase accepts a retention base (the last link retention deleted) only when its
// link was past the retention period and, with the audit key, only when the purge that
// moved it sealed it.
func checkBase(h store.ChainHead, opt VerifyOptions) string {
	if h.BaseSeq == 0 {
		return ""
	}
	if h.BaseAt != nil && opt.Retention > 0 && h.BaseAt.After(opt.Now.Add(-opt.Retention)) {
		return fmt.Sprintf("the retention base is link %d of %s, within the retention period (events are kept %s): events were deleted that retention had not reached",
			h.BaseSeq, h.BaseAt.UTC().Format(time.RFC3339), opt.Retention)
	}
	if len(opt.Keys) == 0 {
		return ""
	}
	switch opt.Keys.CheckBase(h) {
	case store.MACValid:
	case store.MACAbsent:
		if h.BaseAt != nil && opt.KeyedSince > 0 {
			return fmt.Sprintf("the retention base (link %d) carries no MAC although the trail is keyed: it was moved without the audit key", h.BaseSeq)
		}
		if opt.RequireMAC {
			return fmt.Sprintf("the retention base (link %d) carries no MAC (--require-mac)", h.BaseSeq)
		}
	case store.MACUnknown:
		return fmt.Sprintf("the retention base (link %d) is sealed with audit key %s, which verify was not given", h.BaseSeq, *h.BaseMACKey)
	default:
		return fmt.Sprintf("the retention base (link %d) does not match its MAC: it was moved without the audit key", h.BaseSeq)
	}
	return ""
}

// checkCheckpoint holds the run's chain (already found consistent from its base to its
// head) to the checkpoint's record of it: the head at or past the checkpoint's link, that
// link's hash unchanged, the base never set back, and a base moved since only by
// retention (a recorded time past the retention period, sealed under the key).
func checkCheckpoint(h store.ChainHead, chained []store.ChainEvent, cp checkpointState) (int64, string) {
	when := cp.at.Format(time.RFC3339)
	switch {
	case h.Seq < cp.Seq:
		return 0, fmt.Sprintf("the chain's head is link %d but the checkpoint of %s has link %d (%s): the newest events were deleted and the head set back",
			h.Seq, when, cp.Seq, short(cp.Head))
	case h.BaseSeq < cp.BaseSeq || h.BaseSeq == cp.BaseSeq && h.BaseHash != cp.BaseHash:
		return 0, fmt.Sprintf("the retention base is link %d but the checkpoint of %s has it at link %d: the base was set back or changed",
			h.BaseSeq, when, cp.BaseSeq)
	case h.BaseSeq > cp.BaseSeq && h.BaseAt == nil:
		return 0, fmt.Sprintf("the retention base moved from link %d (checkpoint of %s) to %d without a recorded time: not by airlock's retention",
			cp.BaseSeq, when, h.BaseSeq)
	case cp.Seq == h.BaseSeq && h.BaseHash != cp.Head:
		return 0, fmt.Sprintf("link %d's hash differs from the checkpoint of %s: the chain was rewritten", cp.Seq, when)
	case cp.Seq == h.Seq && h.Head != cp.Head:
		return 0, fmt.Sprintf("the head (link %d) differs from the checkpoint of %s: the chain was rewritten", h.Seq, when)
	}
	if cp.Seq > h.BaseSeq {
		for _, e := range chained {
			if *e.Seq == cp.Seq {
				if *e.Hash != cp.Head {
					return e.ID, fmt.Sprintf("event %d (%s, link %d) differs from the checkpoint of %s: the chain was rewritten up to it", e.ID, e.Kind, cp.Seq, when)
				}
				return 0, ""
			}
		}
		return 0, fmt.Sprintf("link %d, in the checkpoint of %s, is not among the run's events", cp.Seq, when)
	}
	return 0, ""
}

// checkMACs checks each event's MAC with the keys and counts keyed and unkeyed events.
// A missing MAC is a failure after the trail became keyed (KeyedSince) or with
// RequireMAC; a MAC under a key verify was not given, a wrong one, or one repeated (a
// genuine row copied) always is.
func checkMACs(c *ChainCheck, chained, unchained []store.ChainEvent, opt VerifyOptions) (bool, int64, string) {
	seen := map[string]int64{}
	for _, e := range slices.Concat(unchained, chained) {
		if len(opt.Keys) == 0 {
			if e.MAC != nil || e.MACKey != nil {
				c.MACsUnchecked++
			} else {
				c.Unkeyed++
			}
			continue
		}
		switch opt.Keys.CheckMAC(e) {
		case store.MACValid:
			if first, ok := seen[*e.MAC]; ok {
				return false, e.ID, fmt.Sprintf("event %d (%s) repeats the MAC of event %d: a copy of a genuine event was inserted", e.ID, e.Kind, first)
			}
			seen[*e.MAC] = e.ID
			c.Keyed++
		case store.MACAbsent:
			if opt.KeyedSince > 0 && e.ID > opt.KeyedSince {
				return false, e.ID, fmt.Sprintf("event %d (%s) has no MAC although events are keyed since event %d: it was written around airlock (SQL), its MAC was erased, or an instance ran without the audit key", e.ID, e.Kind, opt.KeyedSince)
			}
			if opt.RequireMAC {
				return false, e.ID, fmt.Sprintf("event %d (%s) has no MAC (--require-mac)", e.ID, e.Kind)
			}
			c.Unkeyed++
		case store.MACUnknown:
			return false, e.ID, fmt.Sprintf("event %d (%s) is sealed with audit key %s, which verify was not given: pass every key still in use with --key-file, or the MAC was forged", e.ID, e.Kind, *e.MACKey)
		default:
			return false, e.ID, fmt.Sprintf("event %d (%s) does not match its MAC: it was inserted or rewritten without the audit key", e.ID, e.Kind)
		}
	}
	return true, 0, ""
}

// ErrNoEvents is VerifyChain's answer for a key with no events and no chain.
var ErrNoEvents = errors.New("no events for this key")

// VerifyAll checks every run with events or a chain head, in key order, calling fn with
// each result; an error from fn stops it.
func (s *Service) VerifyAll(ctx context.Context, fn func(ChainCheck) error) error {
	return s.VerifyAllWith(ctx, VerifyOptions{}, fn)
}

// VerifyAllWith is VerifyAll with the options.
//
// The runs are those of the runs table, of the events, of the chain heads and of the
// checkpoint, so a run wiped whole is still named: with the key (or the checkpoint that
// lists it) such a run is reported broken.
func (s *Service) VerifyAllWith(ctx context.Context, opt VerifyOptions, fn func(ChainCheck) error) error {
	opt = opt.prepared()
	extra := opt.ix.keys() // the checkpoint's runs, merged in key order
	check := func(k string) error {
		c, err := s.VerifyChainWith(ctx, k, opt)
		if errors.Is(err, ErrNoEvents) {
			if len(opt.Keys) == 0 {
				return nil // unkeyed, as before the audit key: a run row alone is not checked
			}
			// Every run airlock creates has its claim's event from the same transaction.
			c.Problem = "the run has no events and no chain head: its record was deleted"
		} else if err != nil {
			return err
		}
		return fn(c)
	}
	last := ""
	for after := ""; ; {
		keys, err := s.store.ChainRunKeys(ctx, after, chainPage)
		if err != nil {
			return err
		}
		for _, k := range keys {
			for len(extra) > 0 && extra[0] <= k {
				if extra[0] < k && extra[0] > last {
					if err := check(extra[0]); err != nil {
						return err
					}
				}
				extra = extra[1:]
			}
			if err := check(k); err != nil {
				return err
			}
			last = k
		}
		if len(keys) < chainPage {
			break
		}
		after = keys[len(keys)-1]
	}
	for _, k := range extra {
		if k > last {
			if err := check(k); err != nil {
				return err
			}
		}
	}
	return nil
}

// WriteChainCheck prints one line for a run: "ok" with what was proven, or "BROKEN" with
// the problem and the first bad event.
func WriteChainCheck(w io.Writer, c ChainCheck) error {
	var line string
	if c.OK {
		line = fmt.Sprintf("%s: ok, %d events chained (head link %d, %s)", c.Key, c.Chained, c.Seq, short(c.Head))
		if c.Chained == 0 && c.Seq == 0 {
			line = fmt.Sprintf("%s: ok, no chain yet", c.Key)
		}
	} else {
		line = fmt.Sprintf("%s: BROKEN: %s", c.Key, c.Problem)
		if c.BadEventID != 0 {
			line += fmt.Sprintf(" [first bad event %d]", c.BadEventID)
		}
	}
	if c.Purged > 0 {
		line += fmt.Sprintf("; links 1-%d deleted by retention", c.Purged)
	}
	if c.Checkpointed > 0 {
		line += fmt.Sprintf("; holds to the checkpoint's link %d", c.Checkpointed)
	}
	switch {
	case c.Keyed > 0 && c.Unkeyed > 0:
		line += fmt.Sprintf("; %d MACs checked, %d events unkeyed (written before the audit key was set)", c.Keyed, c.Unkeyed)
	case c.Keyed > 0:
		line += fmt.Sprintf("; %d MACs checked", c.Keyed)
	case c.MACsUnchecked > 0:
		line += fmt.Sprintf("; %d MACs not checked (no audit key given: --key-file)", c.MACsUnchecked)
	case c.Events > 0:
		line += "; unkeyed (no event carries a MAC)"
	}
	switch {
	case c.Unchained > 0 && c.UnchainedBefore > 0:
		line += fmt.Sprintf("; %d events unchained before event %d (written before the chain began)", c.Unchained, c.UnchainedBefore)
	case c.Unchained > 0:
		line += fmt.Sprintf("; %d events unchained (written before the chain began)", c.Unchained)
	}
	_, err := fmt.Fprintln(w, line)
	return err
}
