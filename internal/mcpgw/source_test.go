package mcpgw_test

import (
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/internal/mcpgw"
)

// A tool call's _meta["airlock/source_url"] is the approval card's source link (issue 22
// item 2, "for MCP, the tool call's context"): airlock checks it as it checks
// meta.source_url, so a javascript: link refuses the call, and an https one is on the
// card as a link without opener or referrer.
func TestGatedCallCarriesItsSourceURL(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.startAgent()
		args := map[string]any{"to": "ana@example.com", "text": "your refund of 40 EUR"}
		r, err := e.callMeta("send_mail", args, mcp.Meta{mcpgw.SourceURLMeta: "javascript:alert(1)"})
		if err != nil || !r.IsError || !strings.Contains(text(r), "(invalid_source_url)") {
			t.Fatalf("a javascript: source: %v %q, want the call refused with invalid_source_url", err, text(r))
		}
		r, err = e.callMeta("send_mail", args, mcp.Meta{mcpgw.SourceURLMeta: "https://crm.example.com/requests/881"})
		if err != nil || !strings.Contains(text(r), "(approval_pending)") {
			t.Fatalf("an https source: %v %q", err, text(r))
		}
		page := card(t, e, approvalToken(t, r), signedIn(t, e, "lead-1"))
		if !strings.Contains(page, `<a href="https://crm.example.com/requests/881" rel="noopener noreferrer"`) {
			t.Errorf("the card lacks the source link:\n%s", page)
		}
	})
}
