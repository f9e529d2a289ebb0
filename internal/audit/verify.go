package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

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
func (s *Service) VerifyChainWith(ctx context.Context, key string, opt VerifyOptions) (ChainCheck, error) {
	c := ChainCheck{Key: key}
	// The head first: a link written after it (seq > head) is left for the next check,
	// and every link up to it committed with the head, so it is there to read.
	head, err := s.store.ChainHeadGet(ctx, key)
	hasHead := err == nil
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return c, fmt.Errorf("verify %q: %w", key, err)
	}
	var chained []store.ChainEvent
	var unchained []store.ChainEvent
	for after := int64(0); ; {
		page, err := s.store.ChainEvents(ctx, key, after, chainPage)
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
	if c.Events == 0 && !hasHead {
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
	c.OK = true
	return c, nil
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
func (s *Service) VerifyAllWith(ctx context.Context, opt VerifyOptions, fn func(ChainCheck) error) error {
	for after := ""; ; {
		keys, err := s.store.ChainRunKeys(ctx, after, chainPage)
		if err != nil {
			return err
		}
		for _, k := range keys {
			c, err := s.VerifyChainWith(ctx, k, opt)
			if errors.Is(err, ErrNoEvents) {
				continue // purged meanwhile
			}
			if err != nil {
				return err
			}
			if err := fn(c); err != nil {
				return err
			}
		}
		if len(keys) < chainPage {
			return nil
		}
		after = keys[len(keys)-1]
	}
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
