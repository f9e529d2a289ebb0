package mcpgw

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/client"
)

// addReads lists an upstream's resources, resource templates and prompts as the
// gateway's own: reads, passed through (a resource link a tool returns can be read back).
// The first upstream to offer a URI, template or prompt name has it.
func (g *Gateway) addReads(ctx context.Context, name string, cs *mcp.ClientSession, resources, prompts map[string]string) error {
	caps := cs.InitializeResult().Capabilities
	if caps == nil {
		return nil
	}
	read := func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: req.Params.URI})
		g.recordRead(ctx, "resources/read", name, err)
		return res, err
	}
	if caps.Resources != nil {
		for res, err := range cs.Resources(ctx, nil) {
			if err != nil {
				return fmt.Errorf("list resources: %w", err)
			}
			if prev, ok := resources[res.URI]; ok {
				g.opts.Log.Warn("a resource is offered by two upstreams: the first has it", "uri", res.URI, "upstream", prev, "also", name)
				continue
			}
			resources[res.URI] = name
			g.server.AddResource(res, read)
		}
		for tpl, err := range cs.ResourceTemplates(ctx, nil) {
			if err != nil {
				return fmt.Errorf("list resource templates: %w", err)
			}
			if prev, ok := resources["template:"+tpl.URITemplate]; ok {
				g.opts.Log.Warn("a resource template is offered by two upstreams: the first has it", "template", tpl.URITemplate, "upstream", prev, "also", name)
				continue
			}
			resources["template:"+tpl.URITemplate] = name
			g.server.AddResourceTemplate(tpl, read)
		}
	}
	if caps.Prompts != nil {
		for p, err := range cs.Prompts(ctx, nil) {
			if err != nil {
				return fmt.Errorf("list prompts: %w", err)
			}
			if prev, ok := prompts[p.Name]; ok {
				g.opts.Log.Warn("a prompt is offered by two upstreams: the first has it", "prompt", p.Name, "upstream", prev, "also", name)
				continue
			}
			prompts[p.Name] = name
			g.server.AddPrompt(p, func(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
				res, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: req.Params.Name, Arguments: req.Params.Arguments})
				g.recordRead(ctx, "prompts/get", name, err)
				return res, err
			})
		}
	}
	return nil
}

// recordRead records a resource read or a prompt as a read on the gateway's run (--run-id),
// without the URI or the arguments.
func (g *Gateway) recordRead(ctx context.Context, what, upstream string, err error) {
	if g.opts.RunID == "" {
		return
	}
	call := client.ToolCall{Tool: what, Upstream: upstream, Class: "read", Decision: "passed"}
	if err != nil {
		call.Decision = "upstream_error"
	}
	g.record(context.WithoutCancel(ctx), g.opts.RunID, call)
}

// noteLinks remembers the resource links in a tool's result (also one answered from the
// ledger) as its upstream's: a resource created at run time is in no list read at start.
func (g *Gateway) noteLinks(upstream string, res *mcp.CallToolResult) {
	if res == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range res.Content {
		if l, ok := c.(*mcp.ResourceLink); ok && l.URI != "" {
			g.links[l.URI] = upstream
		}
	}
}

// readLinked serves a resources/read that no listed resource or template answers from
// the upstream whose tool returned a link to that URI: the resource was created at run
// time (a file written, a report made). A URI no tool linked to stays unknown: the agent
// reads only what the upstreams listed or handed out.
func (g *Gateway) readLinked(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		rr, ok := req.(*mcp.ReadResourceRequest)
		if err == nil || method != "resources/read" || !ok || rr.Params == nil {
			return res, err
		}
		g.mu.Lock()
		upstream, linked := g.links[rr.Params.URI]
		g.mu.Unlock()
		if !linked {
			return res, err
		}
		out, rerr := g.ups[upstream].ReadResource(ctx, &mcp.ReadResourceParams{URI: rr.Params.URI})
		g.recordRead(ctx, "resources/read", upstream, rerr)
		if rerr != nil {
			return nil, rerr
		}
		return out, nil
	}
}
