package app

import (
	"net/http"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/httpapi"
	"github.com/airlockhq/airlock/internal/web"
)

// Mount serves the JSON API (d) and the pages side by side on one mux, as miniflux's
// routes.go mounts its API and UI: neither handler package mounts the other. The pages'
// operator console acts through the API's own services. Every request, a page's too,
// passes the API's outer middleware (httpapi.API.Wrap: request id, nosniff, tracing of
// API routes, access log and metrics, the writer gate, the JSON 404); the pages add
// their own (security headers, CrossOriginProtection, a 64 KiB body limit, sessions).
func Mount(d httpapi.Deps, pages *web.Web) http.Handler {
	aud := d.Audit
	if aud == nil {
		aud = audit.New(d.Store, pages.Now)
	}
	pages.EnableConsole(web.Console{Effects: d.Effects, Failures: d.Failures, Audit: aud, Policy: d.Effects.Policy, Slack: d.Slack})
	api := httpapi.New(d)
	mux := http.NewServeMux()
	api.Register(mux)
	pages.Register(mux)
	return api.Wrap(mux)
}
