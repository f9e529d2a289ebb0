package httpapi

import "net/http"

// whoami names the calling key and what it may do, so a client can check a key without
// touching a run (n8n's credential test treats anything but a 2xx as a bad credential).
// Never the key's id or hash.
func (s *server) whoami(w http.ResponseWriter, r *http.Request) error {
	k := principal(r.Context())
	out := map[string]any{"name": k.Name, "scopes": k.Scopes}
	if k.OnBehalfOf != "" {
		out["on_behalf_of"] = k.OnBehalfOf
	}
	if len(k.Types) > 0 {
		out["types"] = k.Types
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
