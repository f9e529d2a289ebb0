package main

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRevokedKeyAcrossServeProcesses: two `airlock serve` processes on one database, each
// caching API keys for 1s; `airlock apikey revoke` run beside them makes both refuse the
// key within that second (plus the time a request takes on a busy machine).
func TestRevokedKeyAcrossServeProcesses(t *testing.T) {
	const ttl = time.Second
	for name, env := range databases(t) {
		t.Run(name, func(t *testing.T) {
			if _, stderr, err := airlock(t, env, "migrate"); err != nil {
				t.Fatalf("migrate: %v\n%s", err, stderr)
			}
			key, stderr, err := airlock(t, env, "apikey", "create", "--name", "n8n", "--scope", "runs")
			if err != nil {
				t.Fatalf("apikey create: %v\n%s", err, stderr)
			}
			key = strings.TrimSpace(key)
			list, _, err := airlock(t, env, "apikey", "list")
			if err != nil {
				t.Fatal(err)
			}
			id := strings.Fields(strings.Split(list, "\n")[1])[0]
			env := append(env, "AIRLOCK_API_KEY_CACHE_TTL="+ttl.String())
			servers := []string{serveProcess(t, env), serveProcess(t, env)}
			n := 0
			claim := func(base string) int {
				n++
				r, err := postClaim(base, key, fmt.Sprintf("k-%d", n))
				if err != nil && r.status == 0 {
					t.Fatal(err)
				}
				return r.status
			}
			for _, s := range servers {
				if st := claim(s); st != 201 {
					t.Fatalf("claim before the revocation: %d", st)
				}
			}
			if _, stderr, err := airlock(t, env, "apikey", "revoke", id); err != nil {
				t.Fatalf("revoke: %v %s", err, stderr)
			}
			revoked := time.Now()
			for _, s := range servers {
				for claim(s) != 401 {
					if time.Since(revoked) > ttl+time.Second {
						t.Fatalf("%s still accepts the key %s after its revocation (cache TTL %s)", s, time.Since(revoked), ttl)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			t.Logf("both instances refuse the key %s after the revocation", time.Since(revoked).Round(time.Millisecond))
		})
	}
}
