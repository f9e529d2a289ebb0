package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/sqlite"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// diskFull makes a SQLite database unable to grow, and lets it grow again.
type diskFull interface {
	open(t testing.TB, clock *storetest.Clock) store.Store
	fill(t *testing.T)
	free(t *testing.T)
}

// tmpfsFull is a real full disk: the database on a small tmpfs, filled to the last byte
// by another file. It needs root (mount); the test is skipped where mount is refused.
type tmpfsFull struct {
	dir    string
	st     *sqlite.Store
	filler string
}

func newTmpfsFull(t *testing.T) *tmpfsFull {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=32m"); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v): the max_page_count variant still runs", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return &tmpfsFull{dir: dir, filler: filepath.Join(dir, "filler")}
}

func (d *tmpfsFull) open(t testing.TB, clock *storetest.Clock) store.Store {
	st, err := sqlite.Open(context.Background(), filepath.Join(d.dir, "airlock.db"), sqlite.Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.st = st
	return st
}

func (d *tmpfsFull) fill(t *testing.T) {
	// An empty WAL, as after a restart: the next commit must grow it. (A WAL that has been
	// checkpointed is reused in place and takes a few small commits even on a full disk:
	// the readiness check does not rely on its own write alone for that reason.)
	var busy, frames, done int
	if err := d.st.DB().QueryRow(`PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, &frames, &done); err != nil || busy != 0 {
		t.Fatalf("checkpoint: busy %d, %v", busy, err)
	}
	f, err := os.Create(d.filler)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<16)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	// The last bytes: tmpfs counts whole pages.
	for _, err := f.Write(buf[:1]); err == nil; _, err = f.Write(buf[:1]) {
	}
}

func (d *tmpfsFull) free(t *testing.T) {
	if err := os.Remove(d.filler); err != nil {
		t.Fatal(err)
	}
}

// pageCapFull caps the database at its current size with PRAGMA max_page_count, which
// makes SQLite answer SQLITE_FULL as a full disk does. The pragma holds per connection,
// so the store is held to one (as readOnly does for query_only).
type pageCapFull struct {
	st *sqlite.Store
}

func (d *pageCapFull) open(t testing.TB, clock *storetest.Clock) store.Store {
	st := storetest.OpenSQLite(t, clock).(*sqlite.Store)
	st.DB().SetMaxOpenConns(1)
	d.st = st
	return st
}

func (d *pageCapFull) fill(t *testing.T) {
	if _, err := d.st.DB().Exec(`PRAGMA max_page_count = 1`); err != nil { // at least the current size
		t.Fatal(err)
	}
}

func (d *pageCapFull) free(t *testing.T) {
	if _, err := d.st.DB().Exec(`PRAGMA max_page_count = 1073741823`); err != nil {
		t.Fatal(err)
	}
}

// With the disk full, /readyz used to answer 200 while writes failed with 500
// internal. Now readiness answers 503, every write that fails answers 503
// store_unavailable with Retry-After, nothing is half-written, a 503 is not kept as the
// Idempotency-Key's answer, and when space returns readiness and the same request succeed.
func TestDiskFullIsAnOutage(t *testing.T) {
	for _, v := range []struct {
		name string
		make func(t *testing.T) diskFull
	}{
		{"tmpfs", func(t *testing.T) diskFull { return newTmpfsFull(t) }},
		{"max_page_count", func(t *testing.T) diskFull { return &pageCapFull{} }},
	} {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			d := v.make(t)
			h := newHarness(t, storetest.Backend{Name: "sqlite", Open: d.open})
			expect(t, h.do("GET", "/readyz", "", "", ""), 200, "")
			h.claim("before")

			d.fill(t)
			// Readiness is cached for a moment: it turns within a few seconds, then stays.
			probes, unready, checks := 0, 0, map[string]int{}
			for deadline := time.Now().Add(10 * time.Second); unready == 0 && time.Now().Before(deadline); probes++ {
				r := h.do("GET", "/readyz", "", "", "")
				if r.status == 503 {
					unready++
					checks[fmt.Sprint(r.body["check"])]++
					checkUnavailable(t, "readyz", r)
				} else {
					expect(t, r, 200, "")
					time.Sleep(100 * time.Millisecond)
				}
			}
			if unready == 0 {
				t.Fatalf("/readyz answered 200 to %d probes over 10 s with the disk full", probes)
			}
			for range 20 {
				probes++
				r := h.do("GET", "/readyz", "", "", "")
				if r.status != 503 {
					t.Fatalf("/readyz answered %d again with the disk still full: %s", r.status, r.raw)
				}
				unready++
				checks[fmt.Sprint(r.body["check"])]++
			}
			t.Logf("disk full (%s): /readyz answered 503 to %d of %d probes (200 only until the cached answer expired); failed checks %v", v.name, unready, probes, checks)
			expect(t, h.do("GET", "/healthz", "", "", ""), 200, "")

			// Writes: each either commits or fails as an outage, never 500. A full disk can
			// still take a few small writes (free room in a page), so write until one fails.
			var failedKey, failedIdem string
			counts := map[int]int{}
			for i := 0; i < 200 && failedKey == ""; i++ {
				key, idem := fmt.Sprintf("during-%d", i), fmt.Sprintf("idem-during-%d", i)
				r := h.sendLive("POST", "/v1/runs/claim", h.runsKey, idem, `{"key":"`+key+`","payload":{"n":`+strconv.Itoa(i)+`}}`)
				counts[r.status]++
				switch r.status {
				case 201:
				case 503:
					checkUnavailable(t, "claim", r)
					failedKey, failedIdem = key, idem
				default:
					t.Fatalf("claim %s with the disk full: %d %s", key, r.status, r.raw)
				}
			}
			t.Logf("disk full (%s): claims by status %v", v.name, counts)

			if failedKey == "" {
				t.Fatal("200 claims committed with the disk full")
			}
			// Reads go on.
			expect(t, h.get("/v1/runs/before"), 200, "")
			// Nothing of the failed claim was written.
			expect(t, h.get("/v1/runs/"+failedKey), 404, "run_not_found")
			if n := countEvents(t, h, failedKey); n != 0 {
				t.Fatalf("the failed claim left %d events", n)
			}
			if _, ok := d.(*tmpfsFull); ok {
				// A sign-in writes its throttle count: the page says to try again, with 503.
				status, hdr, body := h.form("/login", url.Values{"username": {"nobody"}, "password": {"x"}})
				if status != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(body, "Try again") {
					t.Fatalf("sign-in with the disk full: %d Retry-After=%q\n%s", status, hdr.Get("Retry-After"), body)
				}
			}

			d.free(t)
			ready := false
			for deadline := time.Now().Add(10 * time.Second); !ready && time.Now().Before(deadline); {
				r := h.do("GET", "/readyz", "", "", "")
				ready = r.status == 200
				if !ready {
					time.Sleep(100 * time.Millisecond)
				}
			}
			if !ready {
				t.Fatal("/readyz did not answer 200 within 10 s of space returning")
			}
			// The same request again, with the same Idempotency-Key: it runs now (the 503 was
			// not recorded as the key's answer).
			r := h.sendLive("POST", "/v1/runs/claim", h.runsKey, failedIdem, `{"key":"`+failedKey+`","payload":{"n":`+strings.TrimPrefix(failedKey, "during-")+`}}`)
			expect(t, r, 201, "")
			if r.body["claimed"] != true || r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("the retry after space returned: %s", r.raw)
			}
			var check string
			if err := d.(interface{ store() *sqlite.Store }).store().DB().QueryRow(`PRAGMA integrity_check`).Scan(&check); err != nil || check != "ok" {
				t.Fatalf("integrity_check: %q %v", check, err)
			}
		})
	}
}

func (d *tmpfsFull) store() *sqlite.Store   { return d.st }
func (d *pageCapFull) store() *sqlite.Store { return d.st }

// checkUnavailable: a store outage is 503 store_unavailable with a Retry-After of a few
// seconds and a message that names no file, host or SQL.
func checkUnavailable(t *testing.T, what string, r response) {
	t.Helper()
	if r.status != 503 || r.body["error"] != "store_unavailable" {
		t.Fatalf("%s: %d %s; want 503 store_unavailable", what, r.status, r.raw)
	}
	if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 || s > 10 {
		t.Fatalf("%s: Retry-After %q; want 1 to 10 seconds", what, r.header.Get("Retry-After"))
	}
	msg, _ := r.body["message"].(string)
	for _, leak := range []string{"/", "sqlite", "SQLITE", "127.0.0.1", "SELECT", "INSERT", "UPDATE", "disk I/O", "(13)"} {
		if strings.Contains(msg, leak) {
			t.Fatalf("%s: the message shows %q: %s", what, leak, msg)
		}
	}
}

func countEvents(t *testing.T, h *harness, key string) int {
	t.Helper()
	evs, err := h.env.Store.EventList(context.Background(), key, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	return len(evs)
}

// sendLive sends one API request with an Idempotency-Key and validates the answer
// against the OpenAPI document.
func (h *harness) sendLive(method, path, apiKey, idem, body string) response {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", idem)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	checkLive(h.t, req, resp, raw)
	r := response{status: resp.StatusCode, raw: string(raw), header: resp.Header}
	_ = json.Unmarshal(raw, &r.body)
	return r
}

// form posts a page form as a browser on the same site does.
func (h *harness) form(path string, v url.Values) (int, http.Header, string) {
	h.t.Helper()
	req, err := http.NewRequest("POST", h.url+path, strings.NewReader(v.Encode()))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", h.url)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(raw)
}
