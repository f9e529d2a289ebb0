package store

import (
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migration is one embedded, versioned SQL file named NNNN_description.sql.
type Migration struct {
	Version int
	Name    string
	SQL     string
	// WriterLevel is the level the migration raises the database's writer level to (its
	// first line reads "-- writer-level: N"), 0 when it changes no writer's rules.
	WriterLevel int
}

// WriterLevel is the writer level this binary implements: the highest level its embedded
// migrations set (TestWriterLevelFollowsMigrations holds the two together). A migration
// that adds a fence or changes what every writer must do raises the level; a binary below
// the database's level writes nothing (internal/fleet), and `airlock migrate` refuses to
// raise it while a live instance of a lower level is registered.
//
// Levels: 1 (0027) — effects.version bumped on every change (0013), chains kept by the
// purge (0015), approvals' warnings and escalations scheduled (0019), instances
// registered with a heartbeat. 2 (0028) — a writer with an audit key configured seals
// every event it writes with a MAC (store/mac.go); an older binary cannot, and would leave
// unkeyed events in a keyed trail. 3 (0035) — on PostgreSQL a run's chain head is in
// its run's row: a purge moves the retention base there; an older binary moves it only
// in event_chains, and verify would then report its purge as a deletion.
const WriterLevel = 3

// writerLevelPrefix opens a level-raising migration's first line.
const writerLevelPrefix = "-- writer-level:"

// writerLevelOf reads the level a migration's first line declares (0: none).
func writerLevelOf(name, sql string) (int, error) {
	first, _, _ := strings.Cut(sql, "\n")
	rest, ok := strings.CutPrefix(strings.TrimSpace(first), writerLevelPrefix)
	if !ok {
		if strings.Contains(sql, writerLevelPrefix) {
			return 0, fmt.Errorf("migration %q: %q belongs on the first line", name, writerLevelPrefix)
		}
		return 0, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(rest))
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("migration %q: %s wants a positive number", name, writerLevelPrefix)
	}
	return n, nil
}

// MaxWriterLevel is the highest level ms set (0: none sets one).
func MaxWriterLevel(ms []Migration) int {
	n := 0
	for _, m := range ms {
		n = max(n, m.WriterLevel)
	}
	return n
}

// LoadMigrations reads the *.sql files of dir in fsys, ordered by version. Versions are
// unique. A gap is allowed: branches number their migrations while others land theirs
// (0014 may be merged before 0013), so the backends apply every version the database
// has not recorded, not every version above the highest it has (Pending).
func LoadMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		if e.IsDir() || path.Ext(e.Name()) != ".sql" {
			continue
		}
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %q: name must be NNNN_description.sql", e.Name())
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read migration %q: %w", e.Name(), err)
		}
		lvl, err := writerLevelOf(e.Name(), string(b))
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: e.Name(), SQL: string(b), WriterLevel: lvl})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("migrations %q and %q have the same version", ms[i-1].Name, ms[i].Name)
		}
	}
	return ms, nil
}

// Pending returns the migrations of ms whose version is not in applied, in version order.
func Pending(ms []Migration, applied map[int]bool) []Migration {
	var out []Migration
	for _, m := range ms {
		if !applied[m.Version] {
			out = append(out, m)
		}
	}
	return out
}

// Outdated returns ErrSchemaOutdated when migrations of ms are not in applied.
func Outdated(ms []Migration, applied map[int]bool) error {
	p := Pending(ms, applied)
	if len(p) == 0 {
		return nil
	}
	names := make([]string, len(p))
	for i, m := range p {
		names[i] = m.Name
	}
	return fmt.Errorf("%w: %s not applied (run `airlock migrate`)", ErrSchemaOutdated, strings.Join(names, ", "))
}

// LowerWriters is the refusal of a level-raising migration: live instances registered at
// a lower level than the one it sets. It is ErrLowerWriters.
type LowerWriters struct {
	Migration string
	Level     int
	Instances []Instance
}

func (e *LowerWriters) Error() string {
	names := make([]string, len(e.Instances))
	for i, in := range e.Instances {
		names[i] = fmt.Sprintf("%s (%s, pid %d, version %s, level %d, %s, last seen %s)", in.ID, in.Role, in.PID, in.Version,
			in.Level, dispatchWord(in.Dispatch), in.LastSeen.UTC().Format("2006-01-02T15:04:05Z"))
	}
	return fmt.Sprintf("%s: %s raises the writer level to %d, but %d live instance(s) write at a lower level: %s; "+
		"stop or upgrade them first (docs/deployment.md, Upgrades), or wait %s after they stopped; --force applies it anyway",
		ErrLowerWriters, e.Migration, e.Level, len(e.Instances), strings.Join(names, "; "), InstanceLiveWithin)
}

func (e *LowerWriters) Unwrap() error { return ErrLowerWriters }

func dispatchWord(on bool) string {
	if on {
		return "dispatching"
	}
	return "dispatch off"
}

// LevelGuard decides, inside a migration's transaction, whether the pending migrations of
// ms may run: nil when none raises the level above the database's, when p.Force, or
// when live (seen within InstanceLiveWithin of now) lists no instance below the level
// to be set. live is asked only when a raise is pending.
func LevelGuard(pending []Migration, current int, p MigrateParams, live func() ([]Instance, error)) error {
	target, name := 0, ""
	for _, m := range pending {
		if m.WriterLevel > target {
			target, name = m.WriterLevel, m.Name
		}
	}
	if target <= current || p.Force {
		return nil
	}
	ins, err := live()
	if err != nil {
		return err
	}
	var lower []Instance
	for _, in := range ins {
		if in.Level < target {
			lower = append(lower, in)
		}
	}
	if len(lower) == 0 {
		return nil
	}
	return &LowerWriters{Migration: name, Level: target, Instances: lower}
}
