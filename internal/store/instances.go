package store

import (
	"context"
	"errors"
	"time"
)

// ErrLowerWriters: a migration that raises the writer level was refused because live
// instances registered at a lower level (LowerWriters names them).
var ErrLowerWriters = errors.New("live writers of a lower level")

// The registry's timing (0027_writer_level.sql). Every writer rewrites its row each
// InstanceHeartbeat and reads the database's writer level with it, so a raised level
// stops a lower writer within one heartbeat; a row seen within InstanceLiveWithin (three
// heartbeats and some slack for a slow database) is a live writer, whose presence makes
// `airlock migrate` refuse a raise.
const (
	InstanceHeartbeat  = 5 * time.Second
	InstanceLiveWithin = 20 * time.Second
)

// Instance is one registered writer: a serve, or a CLI command that writes while it runs.
type Instance struct {
	ID        string // host name and a per-process id
	Hostname  string
	PID       int
	Version   string // internal/version
	Level     int    // the writer level its binary implements
	Role      string // serve, or the command (purge, apikey create, …)
	Dispatch  bool   // runs the dispatcher and reconciliation
	StartedAt time.Time
	LastSeen  time.Time
}

// MigrateParams tune ApplyMigrations.
type MigrateParams struct {
	// Force applies a level-raising migration even while live lower-level writers are
	// registered: they keep writing under the old rules until their next heartbeat.
	Force bool
	// Now is the clock live instances are judged by; nil: the backend's.
	Now *time.Time
	// Citus requires a Citus coordinator (PostgreSQL with the citus extension): without
	// it migrate fails rather than create a single-node schema. On a coordinator the
	// tables are placed per the Citus plan whether or not it is set.
	Citus bool
}

// FleetQueries are the registry's statements (0027_writer_level.sql).
type FleetQueries interface {
	// WriterLevelGet reads the database's writer level.
	WriterLevelGet(ctx context.Context) (int, error)
	// InstanceHeartbeat records in one transaction that in is alive at now (nil: the
	// backend's clock) — inserting its row, or rewriting its last_seen, level and dispatch
	// — forgets instances silent for a day, and returns the database's writer level.
	InstanceHeartbeat(ctx context.Context, in Instance, now *time.Time) (int, error)
	// InstanceDeregister removes id's row (none: no error).
	InstanceDeregister(ctx context.Context, id string) error
	// InstanceList returns the registered instances, newest start first; seenSince, when
	// not zero, keeps only those seen at or after it.
	InstanceList(ctx context.Context, seenSince time.Time) ([]Instance, error)
}
