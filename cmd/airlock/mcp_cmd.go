package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	alclient "github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/mcpgw"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/tracing"
)

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func mcpCmd() *cobra.Command {
	var airlockURL, apiKey, runID string
	var lease, wait time.Duration
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve an agent as an MCP server that puts every tool call of its upstream MCP servers through the work ledger",
		Long: `airlock mcp fronts the upstream MCP servers named in the policy's mcp section
(--config) and lists their tools as its own. Read tools pass through; an effect tool is
planned in the run's ledger on the airlock server (kill switch, budget, gate), forwarded
once, and confirmed with its result, so the same call after a restart is answered from the
ledger (marked airlock/replayed in its _meta; an airlock/call_key in a call's _meta makes
an identical call a new effect). Unclassified tools are refused; resources and prompts
pass through. Every call is a tool_call event on the run. On a clean exit (stdin closed,
SIGINT, SIGTERM) it lets forwarded effect calls be confirmed, then releases the run's
lease.

It speaks MCP on stdin/stdout, or streamable HTTP on --listen (a loopback address) when
that flag is given. It talks to airlock at --airlock with --api-key (the runs scope).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, pol, err := mcpConfig(cmd)
			if err != nil {
				return err
			}
			if apiKey == "" {
				return errors.New("give an API key with the runs scope: --api-key or AIRLOCK_API_KEY")
			}
			log := newLogger(cfg)
			pinsPath := mcpgw.PinsPath(cfg.PolicyFile, pol.MCP)
			pins, err := mcpgw.LoadPins(pinsPath)
			if err != nil {
				return err
			}
			if pins == nil {
				log.Warn("no accepted tool definitions: the upstreams' tools are not pinned, so a changed definition is not noticed; review and accept them with airlock mcp tools --accept", "pins", pinsPath)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			stdio := cmd.Flags().Lookup("listen") == nil || !cmd.Flags().Lookup("listen").Changed
			if stdio && cfg.Tracing == tracing.Stdout {
				return errors.New("AIRLOCK_TRACING=stdout would write spans into the MCP stream on stdout: use otlp, or --listen")
			}
			tracer, stopTracing, err := tracing.Setup(ctx, cfg.Tracing)
			if err != nil {
				return err
			}
			defer stopTracing(context.Background())
			opts := mcpgw.Options{Tracer: tracer, Policy: pol, Client: alclient.New(airlockURL, apiKey), RunID: runID, Lease: lease, Wait: wait, Log: log, Pins: pins}
			if h := crashHook(); h != nil {
				opts.Hook = func(point string) error { h(point); return nil }
			}
			g, err := mcpgw.New(ctx, opts)
			if err != nil {
				return err
			}
			defer g.Close()
			listen := cmd.Flags().Lookup("listen")
			if listen == nil || !listen.Changed {
				err := g.Server().Run(ctx, &mcp.StdioTransport{})
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			addr := listen.Value.String()
			host, _, err := net.SplitHostPort(addr)
			if ip := net.ParseIP(host); err != nil || (host != "localhost" && (ip == nil || !ip.IsLoopback())) {
				return fmt.Errorf("--listen %s: the gateway has no authentication of its own; listen on a loopback address (127.0.0.1:PORT)", addr)
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.Server() }, nil),
				ReadHeaderTimeout: 10 * time.Second}
			log.Info("airlock mcp listening", "addr", ln.Addr().String(), "path", "/")
			go func() {
				<-ctx.Done()
				shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(shut)
			}()
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&airlockURL, "airlock", envOr("AIRLOCK_URL", "http://127.0.0.1:8080"), "the airlock server [AIRLOCK_URL]")
	cmd.Flags().StringVar(&apiKey, "api-key", os.Getenv("AIRLOCK_API_KEY"), "API key with the runs scope [AIRLOCK_API_KEY]")
	cmd.Flags().StringVar(&runID, "run-id", os.Getenv("AIRLOCK_RUN_ID"), "the agent's run (its key), unless a tool's run_id_argument names one [AIRLOCK_RUN_ID]")
	cmd.Flags().DurationVar(&lease, "lease", 30*time.Second, "the run's lease; a restarted gateway waits for its predecessor's to lapse")
	cmd.Flags().DurationVar(&wait, "wait", 2*time.Minute, "how long a call waits for another process's lease on its run")
	cmd.AddCommand(mcpToolsCmd())
	return cmd
}

func mcpToolsCmd() *cobra.Command {
	var accept bool
	cmd := &cobra.Command{
		Use:   "tools [--accept]",
		Short: "List the upstreams' tools with their definition digests and classes; --accept pins them",
		Long: `airlock mcp tools connects to every upstream of the policy's mcp section (--config), and
lists each tool with the digest of its definition (name, description, input schema,
annotations), the class the policy gives it, the class its MCP annotations propose
(readOnlyHint: read; destructiveHint: gated effect; otherwise effect) and whether it
matches the accepted catalogue. Review them, then --accept writes every tool's digest to
the pins file (mcp.pins, default: the policy file's name with .pins.json added): from
then on the gateway refuses a tool whose definition changed (tool_changed) until the
catalogue is accepted again. It needs no airlock server.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, pol, err := mcpConfig(cmd)
			if err != nil {
				return err
			}
			path := mcpgw.PinsPath(cfg.PolicyFile, pol.MCP)
			pins, err := mcpgw.LoadPins(path)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			tools, err := mcpgw.Catalogue(ctx, pol, pins, nil)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "UPSTREAM\tTOOL\tPOLICY\tPROPOSED\tDIGEST\tSTATUS")
			for _, t := range tools {
				status := "not pinned"
				switch {
				case pins == nil:
				case t.Changed == "":
					status = "accepted"
				default:
					status = "CHANGED: " + t.Changed
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.Upstream, t.Tool.Name, t.Class, t.Proposed, t.Pin.Digest[:len("sha256:")+16], status)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if !accept {
				if pins == nil {
					fmt.Fprintf(out, "\nnothing is pinned yet: review the tools, then accept them with airlock mcp tools --accept (writes %s)\n", path)
				}
				return nil
			}
			if err := mcpgw.WritePins(path, mcpgw.Accept(tools, cliActor(), time.Now())); err != nil {
				return err
			}
			fmt.Fprintf(out, "\naccepted %d tool definitions into %s: restart the gateways to apply it\n", len(tools), path)
			return nil
		},
	}
	cmd.Flags().BoolVar(&accept, "accept", false, "pin every tool's definition as it is now")
	return cmd
}

// mcpConfig is the configuration and the policy both mcp commands need: a policy file,
// read, with an mcp section.
func mcpConfig(cmd *cobra.Command) (config.Config, *policy.Policy, error) {
	cfg, err := loadConfig(cmd)
	if err != nil {
		return cfg, nil, err
	}
	if cfg.PolicyFile == "" {
		return cfg, nil, errors.New("give the policy file with the mcp section: --config FILE (or AIRLOCK_CONFIG)")
	}
	pol, err := loadPolicy(cfg)
	if err != nil {
		return cfg, nil, fmt.Errorf("policy: %w", err)
	}
	if pol.MCP == nil {
		return cfg, nil, fmt.Errorf("policy %s has no mcp section", cfg.PolicyFile)
	}
	return cfg, pol, nil
}
