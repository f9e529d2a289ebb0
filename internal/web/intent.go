package web

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
)

// The intent cookie keeps an approval's place across a sign-in without writing anything:
// the token's hash and an expiry, sealed with AES-256-GCM under a key generated at
// migrate (site_secrets.intent_cookie) that every instance reads. The raw token is never
// in it; a cookie that was altered, sealed under another key, or expired is ignored.

const intentAAD = "airlock intent cookie v1"

type intentKey struct {
	mu   sync.Mutex
	aead cipher.AEAD
}

// sealer returns the AEAD of the migrated key, read once.
func (w *Web) sealer(ctx context.Context) (cipher.AEAD, error) {
	w.intent.mu.Lock()
	defer w.intent.mu.Unlock()
	if w.intent.aead != nil {
		return w.intent.aead, nil
	}
	raw, err := w.store.SecretGet(ctx, "intent_cookie")
	if err != nil {
		return nil, err
	}
	if len(raw) < 32 {
		return nil, errors.New("site_secrets.intent_cookie is shorter than 32 bytes")
	}
	key := sha256.Sum256(raw)
	block, err := aes.NewCipher(key[:])
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	w.intent.aead = aead
	return aead, nil
}

type intentClaims struct {
	TokenHash string `json:"th"`
	Expires   int64  `json:"exp"` // unix seconds
}

func (w *Web) sealIntent(ctx context.Context, tokenHash string) (string, error) {
	aead, err := w.sealer(ctx)
	if err != nil {
		return "", err
	}
	// The database's clock: the instance that opens the cookie may run on another host.
	now, err := w.Read(ctx, w.store)
	if err != nil {
		return "", err
	}
	plain, _ := json.Marshal(intentClaims{TokenHash: tokenHash, Expires: now.Add(intentLifetime).Unix()})
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce)
	return base64.RawURLEncoding.EncodeToString(aead.Seal(nonce, nonce, plain, []byte(intentAAD))), nil
}

// openIntent returns the token hash of the request's intent cookie, if it is authentic
// and unexpired.
func (w *Web) openIntent(r *http.Request) (string, bool) {
	c, err := r.Cookie(intentCookie)
	if err != nil {
		return "", false
	}
	sealed, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil {
		return "", false
	}
	aead, err := w.sealer(r.Context())
	if err != nil {
		w.log.Error("intent cookie key", "err", err)
		return "", false
	}
	if len(sealed) < aead.NonceSize()+aead.Overhead() {
		return "", false
	}
	plain, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], []byte(intentAAD))
	if err != nil {
		return "", false
	}
	var ic intentClaims
	if json.Unmarshal(plain, &ic) != nil || ic.TokenHash == "" {
		return "", false
	}
	now, err := w.Read(r.Context(), w.store)
	if err != nil || now.Unix() >= ic.Expires {
		return "", false
	}
	return ic.TokenHash, true
}
