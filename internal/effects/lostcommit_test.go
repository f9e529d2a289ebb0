package effects_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// A lost commit reply — the server committed, the connection died before its answer
// arrived (a failover, a crash between commit and acknowledgement) — must never become a
// second request to the provider. A real TCP proxy between the dispatcher and PostgreSQL
// forwards a commit (a COMMIT, or the Sync that ends an autocommit statement or pipeline)
// and then cuts the connection, reading and discarding the server's reply (so the server
// surely committed; the dispatcher sees only a broken connection).
//
//   - The begun-mark's reply lost: the dispatcher does not send (it cannot know the mark
//     committed); the mark did commit, so when the lease lapses the sweep makes the effect
//     unknown (not pending), the authoritative lookup finds nothing, and it is sent once.
//   - The outcome's reply lost, after the provider stored the send: the recorded outcome
//     stands (the dispatcher's retry of the record finds it applied), and no sweep,
//     reconciliation or later round sends it again.
//
// PostgreSQL only: SQLite commits in-process, there is no reply on a wire to lose.
// Before (by hand): a deliver that sent again when recording failed → "provider requests
// = 2, want 1"; a sweep that ignored the begun-mark → "provider requests = 0, want
// exactly 1" (the effect stuck).
func TestLostCommitReplyNeverResends(t *testing.T) {
	for _, c := range []struct {
		name, point string
	}{
		{"begun-mark", "leased"}, // the next commit after the lease is the begun-mark's
		{"outcome", "sent"},      // the next commit after the send is the outcome's
	} {
		t.Run(c.name, func(t *testing.T) {
			e := apptest.NewEffectsEnv(t, storetest.Backend{Name: "postgres", Open: storetest.OpenPostgres}, "")
			direct := e.Store.(*postgres.Store)
			cfg := direct.Pool().Config().Copy()
			px := newCommitCutter(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
			cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", px.port()
			cfg.ConnConfig.Fallbacks = nil
			proxied, err := postgres.OpenConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer proxied.Close()

			eff := e.Queue(t, "lost-"+c.name, "invoice", "default", `{"n":1}`)
			pkey := effects.ProviderKey(eff)
			svc := e.NewService(proxied, e.Clock.Now)
			svc.Hook = apptest.HookOn(c.point, px.arm)
			d := &effects.Dispatcher{Service: svc, BatchSize: 1, Lease: 2 * time.Minute}
			_, err = d.Tick(context.Background())
			if px.cuts() != 1 {
				t.Fatalf("the proxy cut %d connections after a commit, want 1", px.cuts())
			}
			got, gerr := e.Effects.Get(context.Background(), eff.ID)
			if gerr != nil {
				t.Fatal(gerr)
			}
			switch c.name {
			case "begun-mark":
				if !errors.Is(err, store.ErrUnavailable) {
					t.Fatalf("tick with the begun-mark's reply lost: %v; want store.ErrUnavailable", err)
				}
				if n := e.Provider.Requests(pkey); n != 0 {
					t.Fatalf("sent %d times although the begun-mark's commit was not acknowledged", n)
				}
				if got.State != store.EffectSending || got.SendStartedAt == nil {
					t.Fatalf("after the lost reply: state %s, send started %v; want sending with the begun-mark committed", got.State, got.SendStartedAt)
				}
			case "outcome":
				if n := e.Provider.Requests(pkey); n != 1 {
					t.Fatalf("provider requests = %d, want 1", n)
				}
				if got.State != store.EffectCompleted || got.ProviderID != "p-"+pkey {
					t.Fatalf("after the outcome's lost reply: state %s, provider id %q; want completed with p-%s", got.State, got.ProviderID, pkey)
				}
			}
			// Past the lease: sweeps, reconciliations and rounds of a healthy dispatcher,
			// the later ones past the settle window (a "none" counts only then, twice).
			e.Clock.Advance(3 * time.Minute)
			for range 3 {
				e.Tick(t)
				if err := e.Effects.Reconcile(context.Background()); err != nil {
					t.Fatal(err)
				}
				e.Tick(t)
				e.Clock.Advance(e.Policy.Settle("invoice"))
			}
			if n := e.Provider.Requests(pkey); n != 1 {
				t.Fatalf("provider requests = %d, want exactly 1", n)
			}
			if st := e.EffectState(t, eff.ID); st != store.EffectCompleted {
				t.Fatalf("effect %s, want completed", st)
			}
			kinds := e.Kinds(t, eff.RunKey)
			t.Logf("events: %v; provider lookups %d", kinds, e.Provider.Lookups())
			if c.name == "begun-mark" && !contains(kinds, string(store.EventEffectUnknown)) {
				t.Fatalf("events %v: the committed begun-mark should have made the effect unknown at the lease's end", kinds)
			}
		})
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// commitCutter is a TCP proxy to PostgreSQL. Once armed, it forwards the next commit (a
// COMMIT query, or a Sync after Execute messages outside an explicit transaction) and then
// closes the client's side, reading the server's reply to the end and dropping it.
type commitCutter struct {
	ln       net.Listener
	upstream string
	armed    atomic.Bool
	n        atomic.Int32
	wg       sync.WaitGroup
}

func newCommitCutter(t *testing.T, upstream string) *commitCutter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &commitCutter{ln: ln, upstream: upstream}
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *commitCutter) port() uint16 { return uint16(p.ln.Addr().(*net.TCPAddr).Port) }
func (p *commitCutter) arm()         { p.armed.Store(true) }
func (p *commitCutter) cuts() int    { return int(p.n.Load()) }

func (p *commitCutter) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.relay(c) }()
	}
}

func (p *commitCutter) relay(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return
	}
	defer server.Close()
	var cut atomic.Bool
	replied := make(chan struct{})
	go func() { // server → client; after the cut, read and drop until the server's ReadyForQuery
		defer close(replied)
		defer client.Close() // the server hung up: so does the client's side
		buf := make([]byte, 32<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && !cut.Load() {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			} else if n > 0 && bytes.IndexByte(buf[:n], 'Z') >= 0 {
				return // the commit's CommandComplete and ReadyForQuery arrived: committed
			}
			if err != nil {
				return
			}
		}
	}()
	// client → server: untyped start-up messages (SSLRequest/GSSENCRequest, then the
	// StartupMessage), then typed messages.
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(client, hdr[:4]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:4])
		body := make([]byte, n-4)
		if _, err := io.ReadFull(client, body); err != nil {
			return
		}
		if _, err := server.Write(append(hdr[:4], body...)); err != nil {
			return
		}
		code := binary.BigEndian.Uint32(body[:4])
		if code != 80877103 && code != 80877104 {
			break
		}
	}
	// A commit reaches the server as a COMMIT (pgx sends BEGIN and COMMIT as simple
	// queries) or, for a statement or pipeline outside an explicit transaction, as the Sync
	// after its Execute messages: the implicit transaction commits there (BeginSends's
	// guard and mark, a group's outcomes in one statement).
	inTx, executed := false, false
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(client, hdr[:]); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[1:])-4)
		if _, err := io.ReadFull(client, body); err != nil {
			return
		}
		commit := false
		switch hdr[0] {
		case 'Q':
			q := bytes.ToLower(bytes.TrimSpace(bytes.TrimRight(body, "\x00")))
			switch {
			case bytes.HasPrefix(q, []byte("begin")), bytes.HasPrefix(q, []byte("start transaction")):
				inTx = true
			case bytes.Equal(q, []byte("commit")):
				inTx, commit = false, true
			case bytes.Equal(q, []byte("rollback")):
				inTx = false
			}
		case 'E': // Execute
			executed = true
		case 'S': // Sync
			commit = executed && !inTx
			executed = false
		}
		if commit && p.armed.CompareAndSwap(true, false) {
			cut.Store(true)
			if _, err := server.Write(append(hdr[:], body...)); err != nil {
				return
			}
			p.n.Add(1)
			select { // the server's answer, never forwarded
			case <-replied:
			case <-time.After(10 * time.Second):
			}
			return // closes both sides: the client sees its connection die mid-commit
		}
		if _, err := server.Write(append(hdr[:], body...)); err != nil {
			return
		}
	}
}
