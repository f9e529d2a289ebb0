package mcpgw

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/validation"
)

// MaxStoredResult is the largest tool result the gateway asks airlock to keep (the API's
// limit for a confirmed result); a larger one is kept as a marker with its size.
const MaxStoredResult = 256 << 10

// StoredResultMeta is the _meta key of a stored result that is not the upstream's result
// byte for byte: what was changed, and the receipt of the real one.
const StoredResultMeta = "airlock/stored_result"

// confirm records the receipt and what can be kept of the result. The tool ran, so the
// confirmation must not fail on the result's content: it is sent in the form airlock
// keeps (StoredResult), and if airlock still refuses that body (a body limit smaller
// than the result, a value its store cannot hold), again with a marker in its place,
// then with the receipt alone. A confirmation repeated after one that committed answers
// as the first did, so each try is safe.
func (g *Gateway) confirm(ctx context.Context, tc *toolCall, owner, receipt string, raw []byte) error {
	runID, effectID := tc.runID, tc.effectID
	forms := []json.RawMessage{StoredResult(raw, receipt), omitted(len(raw), receipt, "refused"), nil}
	var err error
	for i, f := range forms {
		if i > 0 && f != nil && len(f) >= len(forms[0]) {
			continue // no smaller than what was refused
		}
		err = g.opts.Client.ConfirmResult(ctx, runID, effectID, owner, receipt, f)
		if err == nil || !refusedBody(err) {
			return err
		}
		g.opts.Log.Warn("airlock refused the tool's result with its confirmation: confirming with less", "run_id", runID,
			"effect_id", effectID, "result_bytes", len(raw), "err", err)
	}
	return err
}

// refusedBody reports airlock refusing a request for its body (size, content), or failing
// on it: a smaller body may pass. A lost lease, a kill switch or an outage would refuse
// any body alike.
func refusedBody(err error) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && (ae.Status == http.StatusRequestEntityTooLarge || ae.Status == http.StatusBadRequest ||
		ae.Status == http.StatusInternalServerError)
}

// StoredResult is the form of a tool's result (its JSON) that airlock keeps for replays:
// the result itself when every store can hold it; with each NUL character in its strings
// (and keys) written as the text \u0000 when one is there (PostgreSQL cannot store a NUL
// in text or jsonb); a marker with the result's size when it is larger than
// MaxStoredResult. A changed form says so in _meta[StoredResultMeta], with the receipt
// of the real result; the agent that made the call always gets the real one.
func StoredResult(raw []byte, receipt string) json.RawMessage {
	if validation.Depth(raw) >= validation.MaxDepth {
		// Deeper than airlock's bodies may nest (the confirm's body is the first level).
		return omitted(len(raw), receipt, "too_deep")
	}
	out := raw
	if bytes.Contains(raw, []byte(`\u0000`)) {
		var v any
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if dec.Decode(&v) != nil {
			return omitted(len(raw), receipt, "unreadable")
		}
		if n := escapeNUL(&v); n > 0 {
			if m, ok := v.(map[string]any); ok {
				meta, _ := m["_meta"].(map[string]any)
				if meta == nil {
					meta = map[string]any{}
				}
				meta[StoredResultMeta] = map[string]any{"nul_escaped": n, "receipt": receipt}
				m["_meta"] = meta
			}
			b, err := json.Marshal(v)
			if err != nil {
				return omitted(len(raw), receipt, "unreadable")
			}
			out = b
		}
	}
	if len(out) > MaxStoredResult {
		return omitted(len(raw), receipt, "too_large")
	}
	return out
}

// escapeNUL rewrites every NUL character in the strings and keys of v as the text \u0000
// and counts them.
func escapeNUL(v *any) int {
	n := 0
	switch x := (*v).(type) {
	case string:
		if c := strings.Count(x, "\x00"); c > 0 {
			*v, n = strings.ReplaceAll(x, "\x00", `\u0000`), c
		}
	case []any:
		for i := range x {
			n += escapeNUL(&x[i])
		}
	case map[string]any:
		renamed := map[string]any{}
		for k, e := range x {
			n += escapeNUL(&e)
			x[k] = e
			if c := strings.Count(k, "\x00"); c > 0 {
				delete(x, k)
				renamed[strings.ReplaceAll(k, "\x00", `\u0000`)], n = e, n+c
			}
		}
		maps.Copy(x, renamed)
	}
	return n
}

// omitted is the marker kept in place of a result that cannot be kept (why: too_large,
// refused, unreadable): a text for the agent that repeats the call, and its size and
// receipt.
func omitted(size int, receipt, why string) json.RawMessage {
	text := fmt.Sprintf("airlock: this call was performed earlier (receipt %s) and was not sent again; its result (%d bytes) could not be kept (%s), so it is not shown again.", receipt, size, why)
	b, _ := json.Marshal(map[string]any{
		"content": []any{map[string]any{"type": "text", "text": text}},
		"_meta":   map[string]any{StoredResultMeta: map[string]any{"omitted": why, "bytes": size, "receipt": receipt}},
	})
	return b
}

// replay answers a confirmed effect from the ledger, marked in _meta[ReplayedMeta].
// Without a kept result it says what is known: performed, with its receipt, or — when a
// person resolved it as sent without the provider's id — with none.
func replay(effectID, receipt string, result json.RawMessage) *mcp.CallToolResult {
	mark := map[string]any{"effect_id": effectID, "result_recorded": false}
	if receipt != "" {
		mark["receipt"] = receipt
	}
	var res *mcp.CallToolResult
	if result != nil {
		var r mcp.CallToolResult
		if err := json.Unmarshal(result, &r); err == nil {
			res, mark["result_recorded"] = &r, true
		}
	}
	if res == nil {
		text := "airlock: this call was performed earlier (receipt " + receipt + "); it was not sent again, and its result is no longer retained."
		if receipt == "" {
			text = "airlock: this call was performed earlier (a person recorded it as done, without an id from the tool); it was not sent again, and no result was recorded."
		}
		res = &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}
	}
	if res.Meta == nil {
		res.Meta = mcp.Meta{}
	}
	res.Meta[ReplayedMeta] = mark
	return res
}
