package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The events of a run form a hash chain (0015_chain.sql, issue 22): each event stores
// its position in the run's chain (chain_seq, 1 for the first) and chain_hash, the
// SHA-256 of the previous event's chain_hash and of its own canonical content. The
// database computes both as the row is inserted (a trigger, on both backends), in the
// transaction that writes the event, and advances the run's head in event_chains: the
// head row is locked by that update until the transaction ends, so two writers of one
// run — whatever path they come from, leased or not — take turns and never fork it.
//
// Events written before the migration have no link (chain_seq NULL): a run's chain
// starts at its first event written after it.

// ChainHash is chain_hash of an event whose predecessor's chain_hash is prev ("" for
// the first of a run): SHA-256, in hex, of each field written as its byte length, ':'
// and its bytes ("-" for an absent meta or detail), in this order: prev, id, run key,
// at (microseconds since the Unix epoch), kind, version, actor, meta, detail. meta and
// detail are the stored text (PostgreSQL: jsonb's text form). The SQL of both backends
// spells the same encoding; TestChainEveryPathLinked proves they agree with this function.
func ChainHash(prev string, e ChainEvent) string {
	h := sha256.New()
	field := func(s string) {
		h.Write([]byte(strconv.Itoa(len(s))))
		h.Write([]byte{':'})
		h.Write([]byte(s))
	}
	optional := func(s *string) {
		if s == nil {
			h.Write([]byte{'-'})
			return
		}
		field(*s)
	}
	field(prev)
	field(strconv.FormatInt(e.ID, 10))
	field(e.RunKey)
	field(strconv.FormatInt(e.AtMicros, 10))
	field(e.Kind)
	field(strconv.FormatInt(e.Version, 10))
	field(e.Actor)
	optional(e.Meta)
	optional(e.Detail)
	return hex.EncodeToString(h.Sum(nil))
}

// ChainEvent is an event row as the chain hashes it: the stored values exactly.
type ChainEvent struct {
	ID       int64
	RunKey   string
	AtMicros int64
	Kind     string
	Version  int64
	Actor    string
	Meta     *string
	Detail   *string
	Seq      *int64  // nil: written before the chain began (or with the trigger bypassed)
	Hash     *string // nil with Seq
	// MACKey and MAC are the event's MAC and its key's id (store/mac.go); nil when it was
	// written without an audit key.
	MACKey *string
	MAC    *string
}

// ChainHead is a run's row of event_chains: the last link written.
type ChainHead struct {
	RunKey    string
	Seq       int64
	Head      string
	StartedAt time.Time // the first chained event's time
	// BaseSeq and BaseHash are the last link retention deleted (0 and "" when none):
	// the kept chain continues from there.
	BaseSeq  int64
	BaseHash string
	// BaseAt is the base link's time (nil: moved before 0028 recorded it); BaseMACKey and
	// BaseMAC its MAC under the audit key (nil: moved without one).
	BaseAt     *time.Time
	BaseMACKey *string
	BaseMAC    *string
}

// ChainQueries read the hash chain for airlock audit verify.
type ChainQueries interface {
	// ChainEvents returns the run's events after afterID in id order, at most limit.
	ChainEvents(ctx context.Context, key string, afterID int64, limit int) ([]ChainEvent, error)
	// ChainHeadGet returns the run's chain head; ErrNotFound if no chained event was
	// ever written for it.
	ChainHeadGet(ctx context.Context, key string) (ChainHead, error)
	// ChainRunKeys returns, in order, up to limit keys after afterKey of runs that have
	// events, a chain head or a row in workflow_runs.
	ChainRunKeys(ctx context.Context, afterKey string, limit int) ([]string, error)
	// ChainHeads returns, in key order, up to limit heads after afterKey (checkpoints).
	ChainHeads(ctx context.Context, afterKey string, limit int) ([]ChainHead, error)
	// ChainFirstKeyed returns the smallest id of an event that carries a MAC (0: none):
	// from there on, every event airlock writes carries one.
	ChainFirstKeyed(ctx context.Context) (int64, error)
}

// PurgedLink is an event a retention purge deleted, as the chain knows it.
type PurgedLink struct {
	RunKey   string
	Seq      int64
	Hash     string
	AtMicros int64
}

// ChainBase is a run's new retention base: the last link a purge deleted, its time, and
// (with an audit key) the base's MAC, so that verify can tell a base retention moved from
// one a database writer moved.
type ChainBase struct {
	RunKey   string
	Seq      int64
	Hash     string
	AtMicros int64
	MACKey   *string
	MAC      *string
}

// ChainBases returns, in key order (the order writers lock heads in), each run's last
// link among the deleted ones, sealed with key (nil: unsealed). A purge sets them in the
// transaction that deletes the rows, never ahead of or apart from the deletion.
func ChainBases(key *AuditKey, deleted []PurgedLink) []ChainBase {
	last := map[string]PurgedLink{}
	for _, d := range deleted {
		if l, ok := last[d.RunKey]; !ok || d.Seq > l.Seq {
			last[d.RunKey] = d
		}
	}
	out := make([]ChainBase, 0, len(last))
	for _, l := range last {
		b := ChainBase{RunKey: l.RunKey, Seq: l.Seq, Hash: l.Hash, AtMicros: l.AtMicros}
		if key != nil {
			id, mac := key.ID(), key.baseTag(b)
			b.MACKey, b.MAC = &id, &mac
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b ChainBase) int { return strings.Compare(a.RunKey, b.RunKey) })
	return out
}
