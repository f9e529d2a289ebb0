// Package fleet keeps one process's membership in the registry of writers
// (0027_writer_level.sql): it registers the process, rewrites its row every heartbeat,
// reads the database's writer level with each, and says whether the process may write.
//
// A binary implements one writer level (store.WriterLevel). When the database's is
// higher, a migration has added a fence or changed what writers must do, and this binary
// does not know the new rules: it writes nothing more, for good (ErrLevelBehind). When
// the heartbeat has not reached the database for longer than a live instance's window,
// `airlock migrate` may already count the process as gone: it writes nothing until a
// heartbeat succeeds again (store.ErrUnavailable). Between a level raise and the
// heartbeat that reads it, a lower writer still writes; that is why migrate refuses a
// raise while one is live.
package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlockhq/airlock/internal/periodic"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/version"
)

// ErrLevelBehind: the database's writer level is above this binary's. A *LevelError
// carries both levels.
var ErrLevelBehind = errors.New("this binary's writer level is below the database's")

// LevelError is ErrLevelBehind with its levels.
type LevelError struct {
	Own, Database int
	Version       string
}

func (e *LevelError) Error() string {
	return fmt.Sprintf("%s: airlock %s implements writer level %d, the database requires %d; it writes nothing — replace it with a release at level %d or later",
		ErrLevelBehind, e.Version, e.Own, e.Database, e.Database)
}

func (e *LevelError) Unwrap() error { return ErrLevelBehind }

// Config describes the process that joins.
type Config struct {
	Store store.Store
	// ID names the instance; "": the host name and a random suffix.
	ID string
	// Role is serve, or the CLI command (purge, apikey create, …).
	Role string
	// Dispatch: the process runs the dispatcher and reconciliation.
	Dispatch bool
	// Level is the writer level the process implements: store.WriterLevel, or lower
	// where a test plays an older binary.
	Level int
	Log   *slog.Logger // nil: discarded
	// Interval is the heartbeat; 0: store.InstanceHeartbeat.
	Interval time.Duration
	// Now is the registry's clock; nil: the backend's.
	Now func() time.Time
}

// Member is a joined process.
type Member struct {
	cfg  Config
	self store.Instance
	log  *slog.Logger

	behind   atomic.Pointer[LevelError] // set once, never cleared
	lastOK   atomic.Int64               // unix nanoseconds of the last successful heartbeat (process clock)
	stale    time.Duration
	reported sync.Once
}

// NewID names an instance: its host name and a random suffix (a restarted process is a
// new instance).
func NewID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "airlock"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return host + "-" + hex.EncodeToString(b)
}

// Join registers the process and reads the database's level. It fails only when the
// database does not answer; a database above this binary's level gives a Member whose
// Err is a *LevelError.
func Join(ctx context.Context, cfg Config) (*Member, error) {
	if cfg.Interval == 0 {
		cfg.Interval = store.InstanceHeartbeat
	}
	if cfg.ID == "" {
		cfg.ID = NewID()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	host, _ := os.Hostname()
	m := &Member{cfg: cfg, log: cfg.Log, stale: store.InstanceLiveWithin - cfg.Interval,
		self: store.Instance{ID: cfg.ID, Hostname: host, PID: os.Getpid(), Version: version.String(),
			Level: cfg.Level, Role: cfg.Role, Dispatch: cfg.Dispatch}}
	if err := m.beat(ctx); err != nil {
		return nil, fmt.Errorf("register instance: %w", err)
	}
	return m, nil
}

// Instance is the process's row as it registered.
func (m *Member) Instance() store.Instance { return m.self }

// beat rewrites the row and reads the level.
func (m *Member) beat(ctx context.Context) error {
	var now *time.Time
	if m.cfg.Now != nil {
		t := m.cfg.Now()
		now = &t
	}
	level, err := m.cfg.Store.InstanceHeartbeat(ctx, m.self, now)
	if err != nil {
		return err
	}
	m.lastOK.Store(time.Now().UnixNano())
	if level > m.self.Level && m.behind.Load() == nil {
		le := &LevelError{Own: m.self.Level, Database: level, Version: m.self.Version}
		m.behind.Store(le)
		m.reported.Do(func() {
			m.log.Error("writer level behind: this instance stops writing", "instance", m.self.ID,
				"level", m.self.Level, "database_level", level, "version", m.self.Version, "err", le.Error())
		})
	}
	return nil
}

// Err says whether the process may write now: nil, a *LevelError (never again), or
// store.ErrUnavailable while the heartbeat has not reached the database for longer than
// a live instance's window allows.
func (m *Member) Err() error {
	if le := m.behind.Load(); le != nil {
		return le
	}
	if since := time.Since(time.Unix(0, m.lastOK.Load())); since > m.stale {
		return store.Unavailable(fmt.Errorf("instance %s: no heartbeat reached the registry for %s", m.self.ID, since.Round(time.Second)))
	}
	return nil
}

// Run heartbeats until ctx ends, logging failures.
func (m *Member) Run(ctx context.Context) {
	periodic.Every(ctx, m.cfg.Interval, m.beat, func(err error) {
		m.log.Warn("instance heartbeat failed", "instance", m.self.ID, "err", err)
	})
}

// Leave removes the process's row (a clean exit).
func (m *Member) Leave(ctx context.Context) error {
	return m.cfg.Store.InstanceDeregister(ctx, m.self.ID)
}

// While runs fn while the process may write: it starts fn when Err is nil, cancels fn's
// context when Err stops being nil (checked every poll), waits for fn to return, and
// starts it again when writing is allowed once more. It returns when ctx ends.
func (m *Member) While(ctx context.Context, poll time.Duration, fn func(ctx context.Context)) {
	for ctx.Err() == nil {
		if m.Err() != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(poll):
				continue
			}
		}
		fctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); fn(fctx) }()
		t := time.NewTicker(poll)
	watch:
		for {
			select {
			case <-done:
				break watch
			case <-t.C:
				if m.Err() != nil {
					cancel()
					<-done
					break watch
				}
			}
		}
		t.Stop()
		cancel()
		select { // fn returned or was stopped: look again after a poll, not at once
		case <-ctx.Done():
		case <-time.After(poll):
		}
	}
}
