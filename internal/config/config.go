// Package config is airlock's one table of options: each has a flag, an environment
// variable, a default and a parser, and a bad value stops start-up with a message that
// names the option.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Config is the validated result.
type Config struct {
	DatabaseURL string
	// ListenDatabaseURL is PostgreSQL's connection for LISTEN when DatabaseURL goes
	// through a transaction pooler ("": a connection of the pool).
	ListenDatabaseURL string
	// DatabaseQueryMode is pgx's query exec mode for PostgreSQL ("" keeps the URL's or
	// pgx's default, cache_statement).
	DatabaseQueryMode string
	PolicyFile        string
	PublicURL         string
	Listen            string
	LeaseDefault      time.Duration
	LeaseMax          time.Duration
	LeaseLifetimeMax  time.Duration
	ReclaimAlertAfter int64
	MaxBodyBytes      int64
	APIKeyCacheTTL    time.Duration
	Migrate           bool
	SQLiteSynchronous string
	LogLevel          slog.Level
	Tracing           string
	// MemoryLimit is the Go runtime's soft memory limit for serve: MemoryLimitAuto,
	// MemoryLimitOff, or a number of bytes. An explicit GOMEMLIMIT wins over it.
	MemoryLimit int64
	// AIActionsEnabled is the process's kill switch, AI_ACTIONS_ENABLED as given: "true"
	// (the default, so also when unset) leaves sending to the database's kill switch;
	// any other value, the empty one included, stops every send from this process.
	AIActionsEnabled string
	// AuditKeyFile is the audit key (`airlock audit keygen`): every event written is
	// sealed with a MAC under it ("": events are written unkeyed).
	AuditKeyFile string
	// AuditCheckpointDir is where serve writes signed checkpoints of the chain heads
	// ("": none); AuditCheckpointInterval how often, besides after each approval decision.
	AuditCheckpointDir      string
	AuditCheckpointInterval time.Duration
}

// envAIActionsEnabled is the one option whose value is not trimmed: only exactly "true"
// lets sends through, so " true" stops them as it always has (a kill switch fails closed).
const envAIActionsEnabled = "AI_ACTIONS_ENABLED"

// MemoryLimit's two words.
const (
	MemoryLimitOff  int64 = 0
	MemoryLimitAuto int64 = -1
)

// Backend names the store a database URL selects: postgres:// and postgresql:// URLs
// and libpq keyword DSNs (host=db dbname=airlock) are PostgreSQL; anything else is a
// SQLite file path (sqlite:PATH too). Load has refused every other form.
func (c Config) Backend() (backend, target string) {
	u := strings.TrimSpace(c.DatabaseURL)
	switch {
	case strings.HasPrefix(u, "postgres://"), strings.HasPrefix(u, "postgresql://"):
		return "postgres", u
	case keywordDSN(u) == nil:
		return "postgres", u
	case strings.HasPrefix(u, "sqlite://"):
		return "sqlite", strings.TrimPrefix(u, "sqlite://")
	case strings.HasPrefix(u, "sqlite:"):
		return "sqlite", strings.TrimPrefix(u, "sqlite:")
	}
	return "sqlite", u
}

// libpqKeywords are the keys a PostgreSQL keyword DSN may use: libpq's connection
// parameters, pgx's pool settings, and the run-time parameters people set there.
var libpqKeywords = map[string]bool{}

func init() {
	for _, k := range strings.Fields(`host hostaddr port dbname user password passfile
		connect_timeout client_encoding options application_name fallback_application_name
		keepalives keepalives_idle keepalives_interval keepalives_count tcp_user_timeout
		sslmode sslcert sslkey sslrootcert sslcrl sslpassword sslsni sslnegotiation
		require_auth channel_binding gssencmode krbsrvname service target_session_attrs
		load_balance_hosts min_read_buffer_size statement_cache_capacity
		description_cache_capacity default_query_exec_mode pool_max_conns pool_min_conns
		pool_min_idle_conns pool_max_conn_lifetime pool_max_conn_lifetime_jitter
		pool_max_conn_idle_time pool_health_check_period search_path timezone
		statement_timeout lock_timeout idle_in_transaction_session_timeout`) {
		libpqKeywords[k] = true
	}
}

// keywordDSN checks s as a libpq keyword/value DSN (key=value pairs separated by spaces,
// values optionally in single quotes).
func keywordDSN(s string) error {
	s = strings.TrimSpace(s)
	if s == "" || !strings.Contains(s, "=") {
		return errors.New("not a keyword DSN")
	}
	for s != "" {
		i := strings.IndexByte(s, '=')
		if i < 0 {
			return fmt.Errorf("%q has no value", s)
		}
		key := strings.TrimSpace(s[:i])
		if !libpqKeywords[key] {
			return fmt.Errorf("%q is not a PostgreSQL connection keyword", key)
		}
		s = strings.TrimLeft(s[i+1:], " \t")
		if strings.HasPrefix(s, "'") {
			end := 1
			for end < len(s) && s[end] != '\'' {
				if s[end] == '\\' {
					end++
				}
				end++
			}
			if end >= len(s) {
				return fmt.Errorf("the value of %s has no closing quote", key)
			}
			s = s[end+1:]
		} else if j := strings.IndexAny(s, " \t"); j >= 0 {
			s = s[j:]
		} else {
			s = ""
		}
		s = strings.TrimLeft(s, " \t")
	}
	return nil
}

// keywordStart is how a keyword DSN begins (a path may hold "=" too, but never before a "/").
var keywordStart = regexp.MustCompile(`^\s*[A-Za-z_]+\s*=`)

// checkDatabaseURL accepts a PostgreSQL URL, a libpq keyword DSN, or something that looks
// like a file path; a keyword DSN with a typo must not become a SQLite file of that name.
func checkDatabaseURL(v string) error {
	switch {
	case strings.HasPrefix(v, "postgres://"), strings.HasPrefix(v, "postgresql://"):
		return nil
	case keywordStart.MatchString(v):
		if err := keywordDSN(v); err != nil {
			return fmt.Errorf("looks like a PostgreSQL keyword DSN (host=… dbname=…) but %v", err)
		}
		return nil
	}
	path := v
	if p, ok := strings.CutPrefix(v, "sqlite:"); ok {
		path = strings.TrimPrefix(p, "//")
	} else if strings.Contains(v, "://") || strings.HasPrefix(v, "mysql:") || strings.HasPrefix(v, "pg:") {
		return errors.New("must be a postgres:// URL, a PostgreSQL keyword DSN (host=… dbname=…), or a SQLite file path")
	}
	if path == "" || strings.ContainsAny(path, "?#\x00") {
		return errors.New("a SQLite file path must be a plain path (no ?, # or options)")
	}
	return nil
}

// Option is one row of the table.
type Option struct {
	Flag    string // --flag
	Env     string // environment variable
	Default string
	Help    string
	set     func(c *Config, v string) error
}

// Options is the table. Order is the order of --help and of docs/configuration.md's table.
var Options = []Option{
	{"database-url", "AIRLOCK_DATABASE_URL", "airlock.db",
		"SQLite file path (or sqlite:PATH), a postgres:// URL, or a PostgreSQL keyword DSN (host=… dbname=…)",
		func(c *Config, v string) error {
			if strings.TrimSpace(v) == "" {
				return errors.New("must not be empty")
			}
			if err := checkDatabaseURL(v); err != nil {
				return err
			}
			c.DatabaseURL = v
			return nil
		}},
	{"listen-database-url", "AIRLOCK_LISTEN_DATABASE_URL", "",
		"PostgreSQL behind a transaction pooler: a direct connection (past the pooler) for LISTEN; default: a connection of the pool",
		func(c *Config, v string) error {
			if v == "" {
				return nil
			}
			if !strings.HasPrefix(v, "postgres://") && !strings.HasPrefix(v, "postgresql://") && keywordDSN(v) != nil {
				return errors.New("must be a postgres:// URL or a PostgreSQL keyword DSN")
			}
			c.ListenDatabaseURL = v
			return nil
		}},
	{"database-query-mode", "AIRLOCK_DATABASE_QUERY_MODE", "",
		"PostgreSQL: pgx's query exec mode: cache_statement (pgx's default), cache_describe, describe_exec, exec or simple_protocol; behind a transaction pooler without prepared statement support use exec",
		func(c *Config, v string) error {
			switch v {
			case "", "cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol":
				c.DatabaseQueryMode = v
				return nil
			}
			return errors.New("must be cache_statement, cache_describe, describe_exec, exec or simple_protocol")
		}},
	{"config", "AIRLOCK_CONFIG", "", "policy file (YAML) naming the action types; without one every effect is refused",
		func(c *Config, v string) error {
			if v != "" {
				if err := policyFileReadable(v); err != nil {
					return err
				}
			}
			c.PolicyFile = v
			return nil
		}},
	{"listen", "AIRLOCK_LISTEN", "127.0.0.1:8080", "address the HTTP server listens on (host:port)",
		func(c *Config, v string) error {
			_, port, err := net.SplitHostPort(v)
			if err != nil {
				return err
			}
			if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
				return fmt.Errorf("port %q is not a number from 0 to 65535", port)
			}
			c.Listen = v
			return nil
		}},
	{"public-url", "AIRLOCK_PUBLIC_URL", "", "base URL of approval links (https, except on loopback); default: the policy's public_url, else http://<listen>",
		func(c *Config, v string) error {
			if v == "" {
				return nil
			}
			if err := CheckPublicURL(v); err != nil {
				return err
			}
			c.PublicURL = strings.TrimRight(v, "/")
			return nil
		}},
	{"lease-default", "AIRLOCK_LEASE_DEFAULT", "5m", "lease length when a claim names none",
		duration(func(c *Config) *time.Duration { return &c.LeaseDefault })},
	{"lease-max", "AIRLOCK_LEASE_MAX", "1h", "longest lease a claim or heartbeat may ask for",
		duration(func(c *Config) *time.Duration { return &c.LeaseMax })},
	{"lease-lifetime-max", "AIRLOCK_LEASE_LIFETIME_MAX", "24h",
		"total life of one owner's lease, heartbeats included; past it the owner lets it lapse and claims again",
		duration(func(c *Config) *time.Duration { return &c.LeaseLifetimeMax })},
	{"reclaim-alert-after", "AIRLOCK_RECLAIM_ALERT_AFTER", "3", "alert when one key's lease has been reclaimed more times than this",
		func(c *Config, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return errors.New("must be a whole number ≥ 0")
			}
			c.ReclaimAlertAfter = n
			return nil
		}},
	{"max-body-bytes", "AIRLOCK_MAX_BODY_BYTES", "1048576", "largest request body accepted (bytes)",
		func(c *Config, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1024 || n > 64<<20 {
				return errors.New("must be a number of bytes from 1024 to 67108864")
			}
			c.MaxBodyBytes = n
			return nil
		}},
	{"api-key-cache-ttl", "AIRLOCK_API_KEY_CACHE_TTL", "2s",
		"how long an instance trusts an API key it checked before looking it up again (0 to 30s; 0: every request); a revoked key works at most this long",
		func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || d > 30*time.Second {
				return errors.New("must be a duration from 0 to 30s, such as 2s")
			}
			c.APIKeyCacheTTL = d
			return nil
		}},
	{"migrate", "AIRLOCK_MIGRATE", "true", "apply pending database migrations when serve starts",
		func(c *Config, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return errors.New("must be true or false")
			}
			c.Migrate = b
			return nil
		}},
	{"sqlite-synchronous", "AIRLOCK_SQLITE_SYNCHRONOUS", "full",
		"SQLite durability: full, or normal (faster; may lose the last commits on power loss)",
		func(c *Config, v string) error {
			switch strings.ToLower(v) {
			case "full", "normal":
				c.SQLiteSynchronous = strings.ToUpper(v)
				return nil
			}
			return errors.New("must be full or normal")
		}},
	{"log-level", "AIRLOCK_LOG_LEVEL", "info", "debug, info, warn or error",
		func(c *Config, v string) error { return c.LogLevel.UnmarshalText([]byte(v)) }},
	{"memory-limit", "AIRLOCK_MEMORY_LIMIT", "auto",
		"serve's soft memory limit for the Go runtime: auto (90% of the container's memory limit, none without one), off, or a size such as 512MiB; GOMEMLIMIT, when set, wins",
		func(c *Config, v string) error {
			switch strings.ToLower(v) {
			case "auto":
				c.MemoryLimit = MemoryLimitAuto
				return nil
			case "off":
				c.MemoryLimit = MemoryLimitOff
				return nil
			}
			n, err := ParseSize(v)
			if err != nil || n < 64<<20 {
				return errors.New("must be auto, off, or a size of at least 64MiB such as 512MiB or 2GiB")
			}
			c.MemoryLimit = n
			return nil
		}},
	{"tracing", "AIRLOCK_TRACING", "off", "OpenTelemetry tracing: off, stdout, or otlp (configured by the OTEL_EXPORTER_OTLP_* variables)",
		func(c *Config, v string) error {
			switch v {
			case "off", "stdout", "otlp":
				c.Tracing = v
				return nil
			}
			return errors.New("must be off, stdout or otlp")
		}},
	{"ai-actions-enabled", envAIActionsEnabled, "true",
		"this process's kill switch: true leaves sending to the database's kill switch; any other value stops every send",
		func(c *Config, v string) error { c.AIActionsEnabled = v; return nil }},
	{"audit-key-file", "AIRLOCK_AUDIT_KEY_FILE", "",
		"the audit key file (airlock audit keygen): events are sealed with a MAC under it and checkpoints signed with it",
		func(c *Config, v string) error { c.AuditKeyFile = v; return nil }},
	{"audit-checkpoint-dir", "AIRLOCK_AUDIT_CHECKPOINT_DIR", "",
		"where serve writes signed checkpoints of every run's chain head (needs the audit key)",
		func(c *Config, v string) error { c.AuditCheckpointDir = v; return nil }},
	{"audit-checkpoint-interval", "AIRLOCK_AUDIT_CHECKPOINT_INTERVAL", "5m",
		"how often serve writes a checkpoint (10s to 24h), besides after every approval decision",
		func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 10*time.Second || d > 24*time.Hour {
				return errors.New("must be a duration from 10s to 24h, such as 5m")
			}
			c.AuditCheckpointInterval = d
			return nil
		}},
}

func duration(field func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return errors.New("must be a duration such as 90s, 5m or 1h")
		}
		if d < time.Second {
			return errors.New("must be at least 1s")
		}
		*field(c) = d
		return nil
	}
}

// Load resolves every option: a flag that was set wins, then the environment, then the
// default. flags holds only the flags given on the command line.
func Load(flags map[string]string, lookupEnv func(string) (string, bool)) (Config, error) {
	var c Config
	for _, o := range Options {
		v, source := o.Default, "default"
		if ev, ok := lookupEnv(o.Env); ok {
			v, source = ev, o.Env
		}
		if fv, ok := flags[o.Flag]; ok {
			v, source = fv, "--"+o.Flag
		}
		given := v
		if o.Env != envAIActionsEnabled {
			given = strings.TrimSpace(v)
		}
		if err := o.set(&c, given); err != nil {
			shown := strconv.Quote(v)
			if o.Flag == "database-url" || o.Flag == "listen-database-url" {
				shown = "(value hidden: it may hold a password)"
			}
			return Config{}, fmt.Errorf("invalid %s (from %s) %s: %v", o.Env, source, shown, err)
		}
	}
	switch {
	case c.LeaseDefault > c.LeaseMax:
		return Config{}, fmt.Errorf("invalid AIRLOCK_LEASE_DEFAULT: %s is longer than AIRLOCK_LEASE_MAX %s", c.LeaseDefault, c.LeaseMax)
	case c.LeaseMax > c.LeaseLifetimeMax:
		return Config{}, fmt.Errorf("invalid AIRLOCK_LEASE_MAX: %s is longer than AIRLOCK_LEASE_LIFETIME_MAX %s", c.LeaseMax, c.LeaseLifetimeMax)
	}
	return c, nil
}

// CheckPublicURL requires an absolute https URL, or http on a loopback host: approval links
// are bearer credentials and travel only over TLS.
func CheckPublicURL(v string) error {
	u, err := url.Parse(v)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") || u.RawQuery != "" || u.User != nil {
		return errors.New("must be an absolute http(s) URL without query or credentials")
	}
	if u.Scheme == "http" {
		host := u.Hostname()
		ip := net.ParseIP(host)
		if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return errors.New("must be https (plain http only on a loopback address)")
		}
	}
	return nil
}

// ParseSize reads a size in bytes as GOMEMLIMIT writes it: a whole number with an
// optional B, KiB, MiB, GiB or TiB suffix.
func ParseSize(v string) (int64, error) {
	v = strings.TrimSpace(v)
	unit := int64(1)
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if num, ok := strings.CutSuffix(v, u.suffix); ok {
			v, unit = num, u.n
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/unit {
		return 0, errors.New("not a size")
	}
	return n * unit, nil
}

// policyFileReadable says why a policy file cannot be used, and what to do: a newcomer's
// first mistake is a relative path read from another directory.
func policyFileReadable(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return errors.New("is a directory, not a policy file (YAML)")
	case err == nil:
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("cannot be read (%v): the user running airlock needs read access", errors.Unwrap(err))
		}
		return f.Close()
	case errors.Is(err, fs.ErrNotExist):
		where := path
		if abs, aerr := filepath.Abs(path); aerr == nil && abs != path {
			where = abs + " (relative to the working directory)"
		}
		return fmt.Errorf("no such file: %s. Write one (docs/policy.md; the tutorial has an example) or give its path; without a policy, leave the setting out: serve starts and refuses every effect", where)
	case errors.Is(err, fs.ErrPermission):
		return errors.New("cannot be read (permission denied): the user running airlock needs read access to it and its directories")
	}
	return fmt.Errorf("cannot be read: %v", errors.Unwrap(err))
}
