package mcpgw_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/internal/store/storetest"
)

// BenchmarkCall measures what the gateway adds to a tool call, on each backend: the
// upstream called directly, a read through the gateway (one event), a new effect
// (claim once, plan, upstream, confirm, event) and a repeated effect answered from the
// ledger (plan, event).
//
//	go test -run '^$' -bench BenchmarkCall -benchtime 200x ./internal/mcpgw
func BenchmarkCall(b *testing.B) {
	for _, be := range storetest.Backends {
		b.Run(be.Name, func(b *testing.B) {
			e := newEnv(b, be)
			e.startAgent()
			ctx := context.Background()
			ct, st := mcp.NewInMemoryTransports()
			if _, err := e.up.server.Connect(ctx, st, nil); err != nil {
				b.Fatal(err)
			}
			direct, err := mcp.NewClient(&mcp.Implementation{Name: "direct", Version: "1"}, nil).Connect(ctx, ct, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer direct.Close()
			b.Run("direct_upstream", func(b *testing.B) {
				for b.Loop() {
					if _, err := direct.CallTool(ctx, &mcp.CallToolParams{Name: "read_note", Arguments: map[string]any{"id": 1}}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("read", func(b *testing.B) {
				for b.Loop() {
					e.mustOK("read_note", map[string]any{"id": 1})
				}
			})
			i := 0
			b.Run("effect_new", func(b *testing.B) {
				for b.Loop() {
					i++
					e.mustOK("write_note", map[string]any{"text": fmt.Sprint("bench-", i)})
				}
			})
			b.Run("effect_replayed", func(b *testing.B) {
				for b.Loop() {
					e.mustOK("write_note", map[string]any{"text": "bench-1"})
				}
			})
		})
	}
}
