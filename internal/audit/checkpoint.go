package audit

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// A checkpoint is every run's chain head (link and hash, and its retention base) at one
// moment, signed with the audit key (HMAC-SHA256) and written outside the database
// (AIRLOCK_AUDIT_CHECKPOINT_DIR). A database writer without the key can neither forge
// one nor change one unnoticed, so verify --checkpoints finds what the chain alone
// cannot: the newest events deleted and the head set back, a run wiped whole, a
// retention base moved or set back — for everything the last checkpoint covered.

// CheckpointFormat names the file format.
const CheckpointFormat = "airlock-audit-checkpoint-v1"

// Checkpoint is one checkpoint file. Field names are a stable contract.
type Checkpoint struct {
	Format    string    `json:"format"`
	WrittenAt time.Time `json:"written_at"`
	// KeyedSince is the first keyed event (store.ChainFirstKeyed) when it was written.
	KeyedSince int64           `json:"keyed_since"`
	Runs       []CheckpointRun `json:"runs"`
	// KeyID and Signature: HMAC-SHA256 under the audit key of the file with both empty.
	KeyID     string `json:"key_id"`
	Signature string `json:"signature"`
}

// CheckpointRun is one run's head in a checkpoint.
type CheckpointRun struct {
	Key      string `json:"key"`
	Seq      int64  `json:"seq"`
	Head     string `json:"head"`
	BaseSeq  int64  `json:"base_seq,omitempty"`
	BaseHash string `json:"base_hash,omitempty"`
}

func (c Checkpoint) body() ([]byte, error) {
	c.KeyID, c.Signature = "", ""
	return json.Marshal(c)
}

// TakeCheckpoint reads every run's head and signs them with key.
func (s *Service) TakeCheckpoint(ctx context.Context, key *store.AuditKey) (Checkpoint, error) {
	return s.takeCheckpoint(ctx, key, 0)
}

// takeCheckpoint is TakeCheckpoint with the first keyed event already known (0: look it
// up). A value found earlier stays right: retention only deletes the oldest events, and
// every event written after it is keyed.
func (s *Service) takeCheckpoint(ctx context.Context, key *store.AuditKey, since int64) (Checkpoint, error) {
	if key == nil {
		return Checkpoint{}, errors.New("checkpoint: no audit key (AIRLOCK_AUDIT_KEY_FILE): an unsigned checkpoint proves nothing")
	}
	if since == 0 {
		var err error
		if since, err = s.store.ChainFirstKeyed(ctx); err != nil {
			return Checkpoint{}, fmt.Errorf("checkpoint: %w", err)
		}
	}
	c := Checkpoint{Format: CheckpointFormat, KeyedSince: since, Runs: []CheckpointRun{}}
	for after := ""; ; {
		heads, err := s.store.ChainHeads(ctx, after, chainPage)
		if err != nil {
			return Checkpoint{}, fmt.Errorf("checkpoint: %w", err)
		}
		for _, h := range heads {
			c.Runs = append(c.Runs, CheckpointRun{Key: h.RunKey, Seq: h.Seq, Head: h.Head, BaseSeq: h.BaseSeq, BaseHash: h.BaseHash})
		}
		if len(heads) < chainPage {
			break
		}
		after = heads[len(heads)-1].RunKey
	}
	// Written after the last head was read: every head listed was committed by then.
	c.WrittenAt = time.Now().UTC()
	body, err := c.body()
	if err != nil {
		return Checkpoint{}, err
	}
	c.KeyID, c.Signature = key.ID(), hex.EncodeToString(key.Sum("airlock checkpoint v1", body))
	return c, nil
}

// WriteCheckpoint writes c into dir as one new file, atomically: a temporary file,
// fsynced, renamed to its name, and the directory fsynced. Several instances writing
// into one directory never collide (each name carries random bytes).
func WriteCheckpoint(dir string, c Checkpoint) (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return "", err
	}
	name := filepath.Join(dir, fmt.Sprintf("checkpoint-%s-%s.json", c.WrittenAt.UTC().Format("20060102T150405.000000000Z"), hex.EncodeToString(suffix)))
	tmp, err := os.CreateTemp(dir, ".checkpoint-*.tmp")
	if err != nil {
		return "", fmt.Errorf("write checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name()) // gone after the rename; left only on failure
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return "", fmt.Errorf("write checkpoint: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", fmt.Errorf("write checkpoint: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("write checkpoint: %w", err)
	}
	if err := os.Rename(tmp.Name(), name); err != nil {
		return "", fmt.Errorf("write checkpoint: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return "", fmt.Errorf("write checkpoint: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return "", fmt.Errorf("write checkpoint: %w", err)
	}
	return name, nil
}

// LoadCheckpoint returns the newest checkpoint in dir whose signature holds under keys.
// A file that is not a checkpoint, or whose signature does not hold, is an error that
// names it: a checkpoint someone changed is itself evidence.
func LoadCheckpoint(dir string, keys store.Keyring) (*Checkpoint, string, error) {
	set, err := LoadCheckpoints(dir, keys)
	if err != nil {
		return nil, "", err
	}
	return set.Newest, set.NewestFile, nil
}

// CheckpointSet is every checkpoint of a directory, for verify: each run's distinct
// recorded states (a head that did not move between two checkpoints is kept once), the
// newest checkpoint, and the earliest first keyed event any of them recorded.
type CheckpointSet struct {
	Files      int
	Newest     *Checkpoint
	NewestFile string
	// States counts the distinct run states kept (what verify checks and holds in memory).
	States     int
	KeyedSince int64
	ix         *checkpointed
}

// LoadCheckpoints reads every checkpoint in dir, each of which must be a checkpoint whose
// signature holds under keys (an error names the first that is not): verify holds each
// run to all of them, so a rollback an older checkpoint saw is found even when a newer
// one was written after it, or the newest files were deleted. Only the distinct states
// are kept, so memory grows with how often heads moved, not with the number of files.
func LoadCheckpoints(dir string, keys store.Keyring) (*CheckpointSet, error) {
	files, err := filepath.Glob(filepath.Join(dir, "checkpoint-*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no checkpoint in %s (checkpoint-*.json)", dir)
	}
	set := &CheckpointSet{ix: newCheckpointed()}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read checkpoint: %w", err)
		}
		var c Checkpoint
		d := json.NewDecoder(bytes.NewReader(b))
		d.DisallowUnknownFields()
		if err := d.Decode(&c); err != nil || c.Format != CheckpointFormat {
			return nil, fmt.Errorf("checkpoint %s: not a checkpoint of this format", f)
		}
		k, ok := keys[c.KeyID]
		if !ok {
			return nil, fmt.Errorf("checkpoint %s is signed with audit key %s, which verify was not given (--key-file)", f, c.KeyID)
		}
		body, err := c.body()
		if err != nil {
			return nil, err
		}
		if !hmac.Equal([]byte(hex.EncodeToString(k.Sum("airlock checkpoint v1", body))), []byte(c.Signature)) {
			return nil, fmt.Errorf("checkpoint %s: its signature does not hold: the file was changed", f)
		}
		set.Files++
		set.ix.add(&c)
		if c.KeyedSince > 0 && (set.KeyedSince == 0 || c.KeyedSince < set.KeyedSince) {
			set.KeyedSince = c.KeyedSince
		}
		if set.Newest == nil || c.WrittenAt.After(set.Newest.WrittenAt) {
			newest := c
			set.Newest, set.NewestFile = &newest, f
		}
	}
	set.States = set.ix.states
	return set, nil
}

// checkpointState is one run's head as one or more checkpoints recorded it; at is the
// newest of them.
type checkpointState struct {
	CheckpointRun
	at time.Time
}

// checkpointed indexes checkpoints' runs by key: each run's distinct states, in the
// order first seen.
type checkpointed struct {
	runs   map[string][]checkpointState
	seen   map[CheckpointRun]int // a state's place in runs[Key]
	states int
}

func newCheckpointed() *checkpointed {
	return &checkpointed{runs: map[string][]checkpointState{}, seen: map[CheckpointRun]int{}}
}

func (ix *checkpointed) add(c *Checkpoint) {
	for _, r := range c.Runs {
		if i, ok := ix.seen[r]; ok {
			if st := &ix.runs[r.Key][i]; c.WrittenAt.After(st.at) {
				st.at = c.WrittenAt
			}
			continue
		}
		ix.seen[r] = len(ix.runs[r.Key])
		ix.runs[r.Key] = append(ix.runs[r.Key], checkpointState{CheckpointRun: r, at: c.WrittenAt})
		ix.states++
	}
}

func indexCheckpoint(c *Checkpoint) *checkpointed {
	if c == nil {
		return nil
	}
	ix := newCheckpointed()
	ix.add(c)
	return ix
}

// keys returns the checkpoints' run keys in order.
func (ix *checkpointed) keys() []string {
	if ix == nil {
		return nil
	}
	out := make([]string, 0, len(ix.runs))
	for k := range ix.runs {
		out = append(out, k)
	}
	slices.SortFunc(out, strings.Compare)
	return out
}

// Checkpointer is serve's checkpoint writer: one checkpoint every Interval and one soon
// after each Wake (an approval decision), wakes that come while one is being written
// folded into the next.
type Checkpointer struct {
	svc      *Service
	key      *store.AuditKey
	dir      string
	interval time.Duration
	wake     chan struct{}
	// keyedSince is the first keyed event once found: the look-up walks the unkeyed
	// history, so it runs until it finds one, not every interval.
	keyedSince int64
}

// NewCheckpointer writes st's checkpoints into dir, signed with key.
func NewCheckpointer(st store.Store, key *store.AuditKey, dir string, interval time.Duration) *Checkpointer {
	return &Checkpointer{svc: New(st, nil), key: key, dir: dir, interval: interval, wake: make(chan struct{}, 1)}
}

// Wake asks for a checkpoint now; it never blocks.
func (c *Checkpointer) Wake() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Once writes one checkpoint; not safe for concurrent use (Run calls it).
func (c *Checkpointer) Once(ctx context.Context) (string, error) {
	cp, err := c.svc.takeCheckpoint(ctx, c.key, c.keyedSince)
	if err != nil {
		return "", err
	}
	c.keyedSince = cp.KeyedSince
	return WriteCheckpoint(c.dir, cp)
}

// Serve is serve's loop: Run, each checkpoint's outcome logged (a failure as an error,
// naming the directory; a file written at debug level, naming the file). Nothing logged
// carries the key or a signature.
func (c *Checkpointer) Serve(ctx context.Context, log *slog.Logger) {
	c.Run(ctx, func(file string, err error) {
		if err != nil {
			log.Error("audit checkpoint failed", "dir", c.dir, "err", err)
			return
		}
		log.Debug("audit checkpoint written", "file", file)
	})
}

// Run writes checkpoints until ctx ends; report is told each one's outcome.
func (c *Checkpointer) Run(ctx context.Context, report func(file string, err error)) {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.wake:
		}
		file, err := c.Once(ctx)
		if ctx.Err() != nil {
			return
		}
		report(file, err)
	}
}
