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
		ms = append(ms, Migration{Version: v, Name: e.Name(), SQL: string(b)})
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
