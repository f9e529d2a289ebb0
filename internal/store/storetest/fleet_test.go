package storetest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// TestWriterLevelFollowsMigrations holds store.WriterLevel to the highest level the
// embedded migrations set, on each backend, and the backends to the same level at each
// version: a migration that raises the level without the binary following fails here.
func TestWriterLevelFollowsMigrations(t *testing.T) {
	pg, err := postgres.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	lite, err := sqlite.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for name, ms := range map[string][]store.Migration{"postgres": pg, "sqlite": lite} {
		if got := store.MaxWriterLevel(ms); got != store.WriterLevel {
			t.Errorf("%s: the migrations set writer level %d, store.WriterLevel is %d", name, got, store.WriterLevel)
		}
	}
	levels := map[int]int{}
	for _, m := range pg {
		levels[m.Version] = m.WriterLevel
	}
	for _, m := range lite {
		if pgLevel, ok := levels[m.Version]; ok && pgLevel != m.WriterLevel {
			t.Errorf("%s: writer level %d on SQLite, %d on PostgreSQL", m.Name, m.WriterLevel, pgLevel)
		}
	}
}

func TestFleet(t *testing.T) {
	Each(t, func(t *testing.T, b Backend) {
		e := newEnv(t, b)
		st := e.Store
		now := e.Clock.Now()
		at := func(d time.Duration) *time.Time { x := now.Add(d); return &x }

		level, err := st.WriterLevelGet(ctx)
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "writer level after migrate", level, store.WriterLevel)

		old := store.Instance{ID: "host-a-1", Hostname: "host-a", PID: 41, Version: "v0.9.0", Level: store.WriterLevel, Role: "serve", Dispatch: true}
		t.Run("HeartbeatRegisters", func(t *testing.T) {
			got, err := st.InstanceHeartbeat(ctx, old, at(0))
			if err != nil {
				t.Fatal(err)
			}
			equal(t, "level read by the heartbeat", got, store.WriterLevel)
			if _, err := st.InstanceHeartbeat(ctx, old, at(3*time.Second)); err != nil {
				t.Fatal(err)
			}
			ins, err := st.InstanceList(ctx, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if len(ins) != 1 {
				t.Fatalf("instances = %+v, want one", ins)
			}
			in := ins[0]
			equal(t, "row", []any{in.ID, in.Hostname, in.PID, in.Version, in.Level, in.Role, in.Dispatch},
				[]any{old.ID, old.Hostname, old.PID, old.Version, old.Level, old.Role, old.Dispatch})
			if !in.StartedAt.Equal(now) || !in.LastSeen.Equal(now.Add(3*time.Second)) {
				t.Fatalf("started_at %v, last_seen %v: want %v and 3s later", in.StartedAt, in.LastSeen, now)
			}
			seen, err := st.InstanceList(ctx, now.Add(4*time.Second))
			if err != nil || len(seen) != 0 {
				t.Fatalf("seen since 4s later: %+v, %v; want none", seen, err)
			}
		})
		t.Run("MigrateRefusesLiveLowerWriters", func(t *testing.T) {
			_, err := ApplyLater(t, st, store.WriterLevel+1, store.MigrateParams{Now: at(5 * time.Second)})
			var lw *store.LowerWriters
			if !errors.As(err, &lw) || !errors.Is(err, store.ErrLowerWriters) {
				t.Fatalf("err = %v, want LowerWriters", err)
			}
			if len(lw.Instances) != 1 || lw.Instances[0].ID != old.ID || !strings.Contains(err.Error(), fmt.Sprintf("host-a-1 (serve, pid 41, version v0.9.0, level %d", store.WriterLevel)) {
				t.Fatalf("refusal names %+v: %v", lw.Instances, err)
			}
			if got, _ := st.WriterLevelGet(ctx); got != store.WriterLevel {
				t.Fatalf("refused migration left level %d", got)
			}
			if err := st.SchemaCurrent(ctx); err != nil {
				t.Fatalf("a refused migration must change nothing: %v", err)
			}
		})
		t.Run("ForceRaisesTheLevel", func(t *testing.T) {
			done, err := ApplyLater(t, st, store.WriterLevel+1, store.MigrateParams{Now: at(5 * time.Second), Force: true})
			if err != nil || len(done) != 1 {
				t.Fatalf("forced: %v, %v", done, err)
			}
			got, err := st.InstanceHeartbeat(ctx, old, at(6*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			equal(t, "level the lower writer reads", got, store.WriterLevel+1)
		})
		t.Run("SilentWritersDoNotCount", func(t *testing.T) {
			// old was last seen at 6s; a raise judged more than the live window later passes.
			late := at(6*time.Second + store.InstanceLiveWithin + time.Second)
			if _, err := ApplyLater(t, st, store.WriterLevel+2, store.MigrateParams{Now: at(10 * time.Second)}); !errors.Is(err, store.ErrLowerWriters) {
				t.Fatalf("within the window: %v, want ErrLowerWriters", err)
			}
			if _, err := ApplyLater(t, st, store.WriterLevel+2, store.MigrateParams{Now: late}); err != nil {
				t.Fatalf("after the window: %v", err)
			}
		})
		t.Run("DeregisterRemoves", func(t *testing.T) {
			if _, err := st.InstanceHeartbeat(ctx, old, at(40*time.Second)); err != nil {
				t.Fatal(err)
			}
			if err := st.InstanceDeregister(ctx, old.ID); err != nil {
				t.Fatal(err)
			}
			if err := st.InstanceDeregister(ctx, old.ID); err != nil {
				t.Fatalf("a second deregistration: %v", err)
			}
			ins, err := st.InstanceList(ctx, time.Time{})
			if err != nil || len(ins) != 0 {
				t.Fatalf("after deregistration: %+v, %v", ins, err)
			}
			if _, err := ApplyLater(t, st, store.WriterLevel+3, store.MigrateParams{Now: at(41 * time.Second)}); err != nil {
				t.Fatalf("with the writer gone: %v", err)
			}
		})
	})
}
