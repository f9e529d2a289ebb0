package config

import (
	"os"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefaults(t *testing.T) {
	c, err := Load(nil, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.DatabaseURL != "airlock.db" || c.Listen != "127.0.0.1:8080" || c.LeaseDefault != 5*time.Minute ||
		!c.Migrate || c.SQLiteSynchronous != "FULL" || c.MaxBodyBytes != 1<<20 || c.APIKeyCacheTTL != 2*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
	if b, target := c.Backend(); b != "sqlite" || target != "airlock.db" {
		t.Fatalf("backend %s %s", b, target)
	}
}

func TestPrecedence(t *testing.T) {
	c, err := Load(map[string]string{"lease-default": "2m"}, env(map[string]string{
		"AIRLOCK_LEASE_DEFAULT": "3m", "AIRLOCK_LISTEN": "0.0.0.0:9000",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.LeaseDefault != 2*time.Minute || c.Listen != "0.0.0.0:9000" {
		t.Fatalf("flag must win over env, env over default: %+v", c)
	}
}

func TestBackend(t *testing.T) {
	for url, want := range map[string]string{
		"postgres://u@h/db":   "postgres",
		"postgresql://u@h/db": "postgres",
		"sqlite:/var/a.db":    "sqlite",
		"sqlite:///var/a.db":  "sqlite",
		"/var/lib/airlock.db": "sqlite",
	} {
		if b, _ := (Config{DatabaseURL: url}).Backend(); b != want {
			t.Errorf("%s: %s, want %s", url, b, want)
		}
	}
}

func TestBadValuesNameTheOption(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"AIRLOCK_LEASE_DEFAULT": "5"}, "AIRLOCK_LEASE_DEFAULT"},
		{map[string]string{"AIRLOCK_LEASE_MAX": "500ms"}, "AIRLOCK_LEASE_MAX"},
		{map[string]string{"AIRLOCK_LISTEN": "localhost"}, "AIRLOCK_LISTEN"},
		{map[string]string{"AIRLOCK_LISTEN": "localhost:99999"}, "AIRLOCK_LISTEN"},
		{map[string]string{"AIRLOCK_MAX_BODY_BYTES": "-1"}, "AIRLOCK_MAX_BODY_BYTES"},
		{map[string]string{"AIRLOCK_MIGRATE": "maybe"}, "AIRLOCK_MIGRATE"},
		{map[string]string{"AIRLOCK_API_KEY_CACHE_TTL": "1m"}, "AIRLOCK_API_KEY_CACHE_TTL"},
		{map[string]string{"AIRLOCK_API_KEY_CACHE_TTL": "-1s"}, "AIRLOCK_API_KEY_CACHE_TTL"},
		{map[string]string{"AIRLOCK_RECLAIM_ALERT_AFTER": "x"}, "AIRLOCK_RECLAIM_ALERT_AFTER"},
		{map[string]string{"AIRLOCK_LOG_LEVEL": "loud"}, "AIRLOCK_LOG_LEVEL"},
		{map[string]string{"AIRLOCK_DATABASE_URL": " "}, "AIRLOCK_DATABASE_URL"},
		{map[string]string{"AIRLOCK_LEASE_MAX": "2h", "AIRLOCK_LEASE_LIFETIME_MAX": "1h"}, "AIRLOCK_LEASE_MAX"},
	} {
		_, err := Load(nil, env(c.env))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v; want it to name %s", c.env, err, c.want)
		}
	}
}

func TestDatabaseURLNeverEchoed(t *testing.T) {
	_, err := Load(nil, env(map[string]string{"AIRLOCK_DATABASE_URL": "mysql://root:hunter2@db/x"}))
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("err = %v", err)
	}
}

// TestDocsListEveryOption keeps docs/configuration.md's table complete.
func TestDocsListEveryOption(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range Options {
		def := "`" + o.Default + "`"
		if o.Default == "" {
			def = "none"
		}
		row := "| `" + o.Env + "` | `--" + o.Flag + "` | " + def + " |"
		if !strings.Contains(string(b), row) {
			t.Errorf("docs/configuration.md has no row starting %s", row)
		}
	}
}

// A libpq keyword DSN ("host=… dbname=…") is PostgreSQL, never a SQLite file named
// after it; a value that is neither a PostgreSQL DSN nor a plausible file path stops
// start-up.
func TestDatabaseURLForms(t *testing.T) {
	for url, want := range map[string]string{
		"host=db user=airlock dbname=airlock":          "postgres",
		" host=/run/postgresql dbname=airlock":         "postgres",
		"dbname=airlock":                               "postgres",
		"user = airlock host = db":                     "postgres",
		"postgres://airlock@db/airlock?sslmode=verify": "postgres",
		"postgresql://airlock@db/airlock":              "postgres",
		"airlock.db":                                   "sqlite",
		"./data/airlock.db":                            "sqlite",
		"/tmp/TestX_with_--migrate=false/a.db":         "sqlite",
		"/var/lib/airlock/airlock.db":                  "sqlite",
		"sqlite:/var/lib/airlock/airlock.db":           "sqlite",
	} {
		c, err := Load(nil, env(map[string]string{"AIRLOCK_DATABASE_URL": url}))
		if err != nil {
			t.Errorf("%q: %v", url, err)
			continue
		}
		if b, target := c.Backend(); b != want {
			t.Errorf("%q: backend %s (target %q), want %s", url, b, target, want)
		}
	}
	for _, url := range []string{
		"mysql://u@h/db", "http://example.com/db", "postgre://u@h/db", "host=db bogus_key=1 dbname=x",
		"pg:host=db", "redis://h", "/tmp/a=b?mode=ro", "airlock.db?mode=memory", "colour=blue",
	} {
		_, err := Load(nil, env(map[string]string{"AIRLOCK_DATABASE_URL": url}))
		if err == nil || !strings.Contains(err.Error(), "AIRLOCK_DATABASE_URL") {
			t.Errorf("%q: err=%v, want start-up refused naming AIRLOCK_DATABASE_URL", url, err)
		}
	}
}

// AI_ACTIONS_ENABLED reaches the outbox as given: unset is "true", and a value that is
// not exactly "true" (padded, empty) is kept so that it stops every send.
func TestAIActionsEnabledKeptVerbatim(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{nil, "true"},
		{map[string]string{"AI_ACTIONS_ENABLED": "true"}, "true"},
		{map[string]string{"AI_ACTIONS_ENABLED": "false"}, "false"},
		{map[string]string{"AI_ACTIONS_ENABLED": ""}, ""},
		{map[string]string{"AI_ACTIONS_ENABLED": " true"}, " true"},
	} {
		cfg, err := Load(nil, env(c.env))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.AIActionsEnabled != c.want {
			t.Errorf("env %q: AIActionsEnabled = %q, want %q", c.env, cfg.AIActionsEnabled, c.want)
		}
	}
}
