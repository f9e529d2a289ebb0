package httpapi

import (
	"bytes"
	"cmp"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// Idempotency-Key on mutating /v1 routes: a reply lost after commit
// is answered again on a retry with the same key, never run twice.
const (
	// replayTTL is how long an answer is kept for replay; retention purges it after.
	replayTTL  = 24 * time.Hour
	maxIdemKey = 255
)

var (
	errReplay     = errors.New("answered before: replay")
	errInProgress = errors.New("a request with this key is in progress")
)

// idempotent runs a mutating request that carries an Idempotency-Key once per key. In one
// transaction (store.Within) it takes the key's lock, answers from the key's record if
// there is one, else runs the handler and records its answer beside every write the
// handler makes: either both commit or neither does. Without the header the route runs
// as it always did.
func (s *server) idempotent(route string, next handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		vals := r.Header.Values("Idempotency-Key")
		if len(vals) == 0 {
			return next(w, r)
		}
		key := vals[0]
		if err := validIdemKey(key); err != nil || len(vals) > 1 {
			if err == nil {
				err = apiError(http.StatusBadRequest, "invalid_idempotency_key", "send one Idempotency-Key header")
			}
			return err
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return decodeError(err)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h := sha256.New()
		fmt.Fprintf(h, "%s %s?%s\n", r.Method, r.URL.EscapedPath(), r.URL.RawQuery)
		h.Write(body)
		hash := hex.EncodeToString(h.Sum(nil))

		ctx := r.Context()
		sc := store.ReplayScope{APIKeyID: principal(ctx).ID, Route: route, Key: key}
		inProgress := func() error {
			w.Header().Set("Retry-After", "1")
			return apiError(http.StatusConflict, "request_in_progress",
				"a request with this Idempotency-Key is still in progress; retry with the same key to get its answer")
		}
		// This instance's requests in flight, refused at once; other instances' are
		// refused by the store's lock (PostgreSQL) or waited for (SQLite's write lock).
		flight := sc.APIKeyID + "\x1f" + sc.Route + "\x1f" + sc.Key
		if _, busy := s.inflight.LoadOrStore(flight, struct{}{}); busy {
			return inProgress()
		}
		defer s.inflight.Delete(flight)

		out := &recorder{header: http.Header{}}
		var after []func()
		var rec store.Replay
		err = s.Store.Within(ctx, func(ctx context.Context) error {
			if ok, err := s.Store.ReplayLock(ctx, sc); err != nil || !ok {
				return cmp.Or(err, errInProgress)
			}
			var err error
			if rec, err = s.Store.ReplayGet(ctx, sc, nil); err == nil {
				return errReplay // nothing to write
			} else if !errors.Is(err, store.ErrNotFound) {
				return err
			}
			ctx = context.WithValue(ctx, afterCommitKey{}, &after)
			if err := next(out, r.WithContext(ctx)); err != nil {
				s.render(out, r, err)
			}
			if out.status == 0 {
				out.status = http.StatusOK
			}
			// An outage is not an outcome, and a kill switch lifts: neither is repeated; a
			// malformed request started nothing and is refused the same way again.
			// Whatever the handler wrote commits as it would without the header.
			if !recorded(out.status) {
				return nil
			}
			sealed, err := seal(rawAPIKey(ctx), sc, replayed{Status: out.status, Header: out.header, Body: out.body.Bytes()})
			if err != nil {
				return err
			}
			return s.Store.ReplayInsert(ctx, store.Replay{ReplayScope: sc, RequestHash: hash, Status: out.status, Response: sealed}, replayTTL, nil)
		})
		switch {
		case errors.Is(err, errReplay):
			if rec.RequestHash != hash {
				return apiError(http.StatusUnprocessableEntity, "idempotency_key_reused",
					"this Idempotency-Key was used for a different request (method, path or body); use a new key for a new request")
			}
			return s.replay(w, r, sc, rec)
		case errors.Is(err, errInProgress):
			return inProgress()
		case err != nil && out.status >= 500:
			// The handler failed first (an outage, most often) and its answer says so; the
			// commit of what it had done failed too (PostgreSQL refuses to commit a
			// transaction a failed statement aborted). Nothing committed, nothing was
			// recorded: a retry runs; nothing waits for a commit.
			after = nil
		case err != nil:
			return err
		}
		for _, f := range after {
			f()
		}
		for k, v := range out.header {
			w.Header()[k] = v
		}
		w.WriteHeader(out.status)
		_, _ = w.Write(out.body.Bytes())
		return nil
	}
}

// recorded reports whether an answer with this status is kept for replay: outcomes are
// (2xx, and refusals such as 409 version_conflict or 422), but not 5xx (an outage),
// 423 (the kill switch, which lifts), nor 400, 413 and 415 (a malformed request: nothing
// started, and the same request is refused the same way again).
func recorded(status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusLocked:
		return false
	}
	return status < 500
}

// replay answers from a record: the original status, headers and body.
func (s *server) replay(w http.ResponseWriter, r *http.Request, sc store.ReplayScope, rec store.Replay) error {
	resp, err := unseal(rawAPIKey(r.Context()), sc, rec.Response)
	if err != nil {
		return fmt.Errorf("replay %s: %w", sc.Route, err)
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.Header().Set("Idempotent-Replayed", "true")
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
	return nil
}

// validIdemKey accepts 1–255 visible ASCII characters (a UUID, a ULID, a hash, …).
func validIdemKey(k string) error {
	if k == "" || len(k) > maxIdemKey {
		return apiError(http.StatusBadRequest, "invalid_idempotency_key", fmt.Sprintf("Idempotency-Key must be 1 to %d characters", maxIdemKey))
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return apiError(http.StatusBadRequest, "invalid_idempotency_key", "Idempotency-Key may hold only visible ASCII characters (no spaces)")
		}
	}
	return nil
}

type afterCommitKey struct{}

// afterCommit runs fn once the request's writes are committed: at once, or, for a request
// with an Idempotency-Key, after its transaction commits (and never if it does not).
func afterCommit(ctx context.Context, fn func()) {
	if after, ok := ctx.Value(afterCommitKey{}).(*[]func()); ok {
		*after = append(*after, fn)
		return
	}
	fn()
}

func rawAPIKey(ctx context.Context) string {
	if info := infoOf(ctx); info != nil {
		return info.rawKey
	}
	return ""
}

// recorder holds a handler's answer until its transaction commits.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}

// replayed is a recorded answer.
type replayed struct {
	Status int         `json:"s"`
	Header http.Header `json:"h"`
	Body   []byte      `json:"b"`
}

// sealKey derives the record's key from the raw API key, which is stored nowhere (only
// its hash is): an answer's secrets (approval links) stay unreadable in the database.
func sealKey(raw string, sc store.ReplayScope) (cipher.AEAD, error) {
	mac := hmac.New(sha256.New, []byte(raw))
	mac.Write([]byte("airlock replay v1\x00" + sc.APIKeyID + "\x00" + sc.Route + "\x00" + sc.Key))
	block, err := aes.NewCipher(mac.Sum(nil))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func seal(raw string, sc store.ReplayScope, resp replayed) ([]byte, error) {
	if raw == "" {
		return nil, errors.New("seal replay: no API key in the request")
	}
	plain, err := json.Marshal(resp)
	if err != nil {
		return nil, err
	}
	aead, err := sealKey(raw, sc)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return aead.Seal(nonce, nonce, plain, nil), nil
}

func unseal(raw string, sc store.ReplayScope, sealed []byte) (replayed, error) {
	var resp replayed
	aead, err := sealKey(raw, sc)
	if err != nil {
		return resp, err
	}
	if len(sealed) < aead.NonceSize() {
		return resp, errors.New("the record is damaged")
	}
	plain, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], nil)
	if err != nil {
		return resp, errors.New("the record does not open with this API key")
	}
	return resp, json.Unmarshal(plain, &resp)
}
