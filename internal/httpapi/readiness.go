package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/fleet"
	"github.com/airlockhq/airlock/internal/store"
)

// Readiness (/readyz) says whether this instance can serve requests now: a load balancer
// or an orchestrator sends it traffic only while it answers 200. It checks, in order:
//
//	level   this binary's writer level is not below the database's (Deps.Writers)
//	read    the database answers (a ping)
//	schema  every migration this binary embeds is applied (a read of schema_migrations)
//	write   a write commits: this instance's row of readiness is rewritten, durably
//	space   (SQLite) the database can still grow by minHeadroom on its file system
//
// The first that fails is the answer: 503 with its code (writer_level_behind,
// store_unavailable, or schema_outdated) and the check's name. The result is kept for readyTTL, so probes from
// many places cost the database at most one check a second; probes that come while a
// check runs wait for it. Liveness (/healthz) checks none of this.
//
// The dispatcher is not part of readiness: readiness decides where requests go, and the
// dispatcher sends what any instance queued whether this one takes requests or not. It
// fails with the store (its errors are logged), and recovers by itself when the store does.
const (
	readyTTL     = time.Second
	readyTimeout = 2 * time.Second
	// minHeadroom is the space SQLite needs to go on committing: a full write-ahead log
	// (1,000 pages of 4 KiB before it is checkpointed) and as much again for the
	// checkpoint to grow the file. Below it, small writes may still commit into the
	// reused log while any larger one fails: the disk is full for practical purposes.
	minHeadroom = 8 << 20
)

// notReady is /readyz's 503 body.
type notReady struct {
	Code    string `json:"error"`
	Message string `json:"message"`
	Check   string `json:"check"` // level, read, schema, write or space
	err     error
}

// readiness keeps the last check's result.
type readiness struct {
	mu  sync.Mutex
	at  time.Time
	res *notReady
}

// get returns the last result if it is fresh, else checks again (one check at a time,
// with its own deadline: a probe that goes away does not fail the check others wait for).
func (rd *readiness) get(ctx context.Context, check func(context.Context) *notReady, log *slog.Logger) *notReady {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if !rd.at.IsZero() && time.Since(rd.at) < readyTTL {
		return rd.res
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyTimeout)
	res := check(cctx)
	cancel()
	switch {
	case res != nil:
		log.Warn("not ready: "+res.Message, "check", res.Check, "err", res.err)
	case rd.res != nil:
		log.Info("ready again", "was", rd.res.Check)
	}
	rd.at, rd.res = time.Now(), res
	return res
}

func (s *server) checkReady(ctx context.Context) *notReady {
	unavailable := func(check, msg string, err error) *notReady {
		return &notReady{Code: "store_unavailable", Check: check, Message: msg, err: err}
	}
	if s.Writers != nil {
		if err := s.Writers.Err(); errors.Is(err, fleet.ErrLevelBehind) {
			return &notReady{Code: "writer_level_behind", Check: "level", err: err, Message: err.Error()}
		}
	}
	if err := s.Store.Ping(ctx); err != nil {
		return unavailable("read", "the database does not answer", err)
	}
	if err := s.Store.SchemaCurrent(ctx); errors.Is(err, store.ErrSchemaOutdated) {
		return &notReady{Code: "schema_outdated", Check: "schema", err: err,
			Message: "the database schema is not current; run `airlock migrate`"}
	} else if err != nil {
		return unavailable("read", "the database does not answer reads", err)
	}
	if err := s.Store.ReadinessWrite(ctx, s.Instance); err != nil {
		return unavailable("write", "the database answers but does not accept writes (full disk, read-only file or directory, read-only session or standby, or held locked); see the server log", err)
	}
	if h, ok := s.Store.(store.Headroom); ok {
		free, err := h.Headroom(ctx)
		if err != nil {
			return unavailable("space", "the free space of the database's disk cannot be read; see the server log", err)
		}
		if free < minHeadroom {
			return unavailable("space", fmt.Sprintf("the database's disk is full: %.1f MiB left, readiness needs %d MiB", float64(free)/(1<<20), minHeadroom>>20), nil)
		}
	}
	return nil
}

// InstanceName names this process in the readiness table: its host name and a random
// suffix (a restarted process is a new instance; the old row is forgotten after a day).
func InstanceName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "airlock"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return host + "-" + hex.EncodeToString(b)
}
