package main

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

func explainCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "explain KEY [--json]",
		Short: "Was a run processed, was it sent, who approved it, which model drafted it",
		Long: `explain answers the four questions about one run from airlock's record — was it
processed? was it sent? who approved it? which model drafted it? — then lists its
effects, approvals, validations and its timeline, one line per event.

--json prints the same document as GET /v1/runs/{key}/explain (see openapi.json).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withStore(cmd, func(st store.Store) error {
				x, err := audit.New(st, nil).Explain(cmd.Context(), args[0])
				if errors.Is(err, runs.ErrNotFound) {
					return fmt.Errorf("no run has the key %q", args[0])
				}
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd, x)
				}
				return audit.WriteExplanation(cmd.OutOrStdout(), x)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of text")
	return cmd
}

func reportCmd() *cobra.Command {
	var since string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "report [--since 7d] [--json]",
		Short: "The weekly figures: duplicate deliveries, gate waits, validation failures, approvals, retry caps",
		Long: `report computes, from the events recorded since the cutoff:

  duplicate-delivery rate   duplicate events / (claims + duplicates); claims are first
                            claims and reclaims of lapsed leases
  gate wait p50 / p95       approval_requested → approval_decided of each approval decided
                            in the window, nearest-rank: measured here, not estimated
  validation failure rate   validation events with valid=false / all validation events
  auto vs human approvals   auto_approved events : approval_decided events with approve
  retry-cap hits            retry_cap events (runs) + effects failed at max_attempts

and counts of runs, claims, effects sent, alerts by kind, the unknown and failed effects
outstanding now and the kill switch's setting. --since takes a Go duration (36h) or days
(7d, 1d12h); the window ends now by the database's clock.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			window, err := audit.ParseWindow(since)
			if err != nil {
				return fmt.Errorf("--since: %w", err)
			}
			return withStore(cmd, func(st store.Store) error {
				r, err := audit.New(st, nil).ReportLast(cmd.Context(), window)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd, r)
				}
				return audit.WriteReport(cmd.OutOrStdout(), r)
			})
		},
	}
	cmd.Flags().StringVar(&since, "since", "7d", "window length: a Go duration (36h) or days (7d)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of text")
	return cmd
}

func printJSON(cmd *cobra.Command, v any) error {
	enc := json.NewEncoder(cmd.OutOrStdout())
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
