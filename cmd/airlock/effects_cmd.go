package main

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/user"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/internal/alerts"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/retention"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// cliActor names the person at the terminal in audit events.
func cliActor() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return "cli:" + u.Username
	}
	return "cli"
}

// withPolicy opens the configured store and policy for an operator command; it sends
// nothing, so the policy's secrets are not resolved.
func withPolicy(cmd *cobra.Command, fn func(st store.Store, pol *policy.Policy) error) error {
	cfg, err := loadConfig(cmd)
	if err != nil {
		return err
	}
	pol, err := loadPolicyWithoutSecrets(cfg)
	if err != nil {
		return err
	}
	return withStore(cmd, func(st store.Store) error { return fn(st, pol) })
}

// operatorLog is an operator command's log: warnings and alerts only, on stderr.
func operatorLog() *slog.Logger {
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// withEffects opens the store and an outbox service (no connectors: nothing is sent from
// an operator command).
func withEffects(cmd *cobra.Command, fn func(svc *effects.Service) error) error {
	cfg, err := loadConfig(cmd)
	if err != nil {
		return err
	}
	return withPolicy(cmd, func(st store.Store, pol *policy.Policy) error {
		log := operatorLog()
		svc, err := effects.New(runs.Base{Store: st, Policy: pol, Log: log, Alerts: alerts.Polled{}},
			effects.Config{AIActionsEnabled: cfg.AIActionsEnabled, AIActionsEnabledSet: true})
		if err != nil {
			return err
		}
		return fn(svc)
	})
}

func effectsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "effects",
		Short: "List effects and resolve the ones whose outcome is unknown",
		Long: `An effect is one external write of a run. One whose outcome is unknown (a timeout
after the request left, a crash between send and record) is never resent automatically:
check the provider, then resolve it:

  sent      it happened (give --provider-id if you found it): completed
  not_sent  it did not: queued again under the same effect id
  abandon   give it up: cancelled`,
	}
	var states []string
	var key string
	list := &cobra.Command{
		Use:   "list [--state unknown,failed] [--key KEY]",
		Short: "List effects",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withEffects(cmd, func(svc *effects.Service) error {
				p := store.EffectListParams{RunKey: key}
				for _, s := range states {
					if !slices.Contains(effectStates, s) {
						return fmt.Errorf("--state: unknown state %q (valid: %s)", s, strings.Join(effectStates, ", "))
					}
					p.States = append(p.States, store.EffectState(s))
				}
				list, err := svc.List(cmd.Context(), p)
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tKEY\tEFFECT_ID\tACTION\tTARGET\tSTATE\tVERSION\tATTEMPTS\tPROVIDER_ID\tERROR\tUPDATED")
				for _, e := range list {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", e.ID, e.RunKey, e.EffectID, e.ActionType,
						e.Target, e.State, e.Version, e.Attempts, dash(e.ProviderID), dash(e.LastErrorClass), e.UpdatedAt.UTC().Format(time.RFC3339))
				}
				return tw.Flush()
			})
		},
	}
	list.Flags().StringSliceVar(&states, "state", nil, "only these states ("+strings.Join(effectStates, ", ")+")")
	list.Flags().StringVar(&key, "key", "", "only this run's effects")

	var outcome, providerID, note string
	var version int64
	var noProviderID bool
	resolve := &cobra.Command{
		Use:   "resolve ID --outcome sent|not_sent|abandon --note TEXT [--provider-id ID | --no-provider-id] [--version N]",
		Short: "Record an operator's decision on an unknown or failed effect",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEffects(cmd, func(svc *effects.Service) error {
				e, err := svc.Resolve(cmd.Context(), args[0],
					effects.Resolution{Outcome: outcome, ProviderID: providerID, NoProviderID: noProviderID, Note: note,
						Version: version}, cliActor())
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "effect %s is now %s\n", e.ID, e.State)
				return nil
			})
		},
	}
	resolve.Flags().StringVar(&outcome, "outcome", "", "sent, not_sent or abandon (required)")
	resolve.Flags().StringVar(&providerID, "provider-id", "", "the provider's id, with --outcome sent")
	resolve.Flags().BoolVar(&noProviderID, "no-provider-id", false, "with --outcome sent: the provider gave no id (sent needs this or --provider-id)")
	resolve.Flags().StringVar(&note, "note", "", "what you checked (required; recorded)")
	resolve.Flags().Int64Var(&version, "version", 0, "the effect's version you checked (effects list shows it): refused if it changed since")
	cmd.AddCommand(list, resolve)
	return cmd
}

// effectStates are the states effects list --state accepts.
var effectStates = []string{string(store.EffectPending), string(store.EffectSending), string(store.EffectPlanned), string(store.EffectCompleted),
	string(store.EffectUnknown), string(store.EffectFailed), string(store.EffectCancelled)}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func actionsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "actions",
		Short: "The kill switch: stop or allow every send, or one action type's",
		Long: `The kill switch is enforced where effects leave airlock (the dispatcher and external
worker claims). A fresh install starts enabled. While disabled, queued effects stay queued
and every blocked send is recorded. AI_ACTIONS_ENABLED=false in airlock's environment
stops every send whatever the database says.`,
	}
	var actionType, reason string
	set := func(enabled bool) func(cmd *cobra.Command, _ []string) error {
		return func(cmd *cobra.Command, _ []string) error {
			if reason == "" {
				return errors.New("--reason is required")
			}
			scope := effects.GlobalScope
			if actionType != "" {
				scope = effects.ActionScope(actionType)
			}
			return withEffects(cmd, func(svc *effects.Service) error {
				if err := svc.SetKillSwitch(cmd.Context(), scope, enabled, reason, cliActor()); err != nil {
					return err
				}
				return printKillSwitch(cmd, svc)
			})
		}
	}
	for _, c := range []*cobra.Command{
		{Use: "disable [--type T] --reason TEXT", Short: "Stop sends (all, or one action type's)", Args: cobra.NoArgs, RunE: set(false)},
		{Use: "enable [--type T] --reason TEXT", Short: "Allow sends again", Args: cobra.NoArgs, RunE: set(true)},
	} {
		c.Flags().StringVar(&actionType, "type", "", "one action type (needs --config); default: all")
		c.Flags().StringVar(&reason, "reason", "", "why (required; recorded with your name)")
		cmd.AddCommand(c)
	}
	cmd.AddCommand(&cobra.Command{Use: "status", Short: "Show the kill switch", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withEffects(cmd, func(svc *effects.Service) error { return printKillSwitch(cmd, svc) })
		}})
	return cmd
}

func printKillSwitch(cmd *cobra.Command, svc *effects.Service) error {
	switches, envDisabled, err := svc.KillSwitch(cmd.Context())
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tENABLED\tBY\tREASON\tSINCE")
	for _, k := range switches {
		fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\n", k.Scope, k.Enabled, k.Actor, k.Reason, k.UpdatedAt.UTC().Format(time.RFC3339))
	}
	if envDisabled {
		fmt.Fprintln(tw, "env\tfalse\tAI_ACTIONS_ENABLED\toverrides the database in this process\t-")
	}
	return tw.Flush()
}

func runsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "Operator actions on runs: replace a finished run's key, unpark a parked run",
		Long: `runs holds what an operator does to one run by hand, on the database airlock serve uses
(--database-url). Each action is recorded as an event on the run, with your name
(cli:<your OS user>) and the reason you give.

  replace   a finished run is linked to a new key issued upstream (the rerun protocol)
  unpark    a run parked for unknown_commit or input_mismatch ends as failed_terminal or
            goes back to failed_retryable

Read a run with GET /v1/runs/{key} or "airlock explain KEY".`,
	}
	var newKey, reason string
	replace := &cobra.Command{
		Use:   "replace KEY --new-key NEW --reason TEXT",
		Short: "Replace a finished run by a new, upstream-issued key (the rerun protocol)",
		Long: `replace links a finished run (completed, failed_terminal or rejected, with no open
effects) to a new key issued upstream for the corrected business event. The new key then
goes through the normal claim, approval and outbox path; the old key keeps answering its
own state. Your name and reason are recorded on the old run.

` + runs.RerunProtocol,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withPolicy(cmd, func(st store.Store, pol *policy.Policy) error {
				svc, err := failures.New(runs.Base{Store: st, Policy: pol, Alerts: alerts.Polled{}})
				if err != nil {
					return err
				}
				r, err := svc.Replace(cmd.Context(), args[0], newKey, reason, cliActor())
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s is replaced by %s; claim %s to proceed (external results of the original: %v)\n",
					r.OldKey, r.NewKey, r.NewKey, r.ProviderIDs)
				return nil
			})
		},
	}
	replace.Flags().StringVar(&newKey, "new-key", "", "the new key, issued upstream (required)")
	replace.Flags().StringVar(&reason, "reason", "", "why (required; recorded with your name)")
	_ = replace.MarkFlagRequired("new-key")
	var to, unparkReason string
	unpark := &cobra.Command{
		Use:   "unpark KEY --to failed_terminal|failed_retryable --reason TEXT",
		Short: "Give a run parked for unknown_commit or input_mismatch a way out",
		Long: `unpark moves a run parked in awaiting_human for unknown_commit or input_mismatch, which
no delivery can reclaim, to failed_terminal (given up; its pending effects are cancelled)
or to failed_retryable (the next delivery with the same payload reclaims it). Check the
provider first. Your name and reason are recorded on the run (event run_unparked). The
API's POST /v1/runs/{key}/unpark and the console do the same.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withPolicy(cmd, func(st store.Store, pol *policy.Policy) error {
				svc, err := failures.New(runs.Base{Store: st, Policy: pol, Alerts: alerts.Polled{}})
				if err != nil {
					return err
				}
				r, err := svc.Unpark(cmd.Context(), args[0], store.State(to), unparkReason, cliActor())
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s is %s (version %d)\n", r.Key, r.State, r.Version)
				return nil
			})
		},
	}
	unpark.Flags().StringVar(&to, "to", "", "failed_terminal or failed_retryable (required)")
	unpark.Flags().StringVar(&unparkReason, "reason", "", "why (required; recorded with your name)")
	_ = unpark.MarkFlagRequired("to")
	_ = unpark.MarkFlagRequired("reason")
	cmd.AddCommand(replace, unpark)
	return cmd
}

func purgeCmd() *cobra.Command {
	var dry bool
	cmd := &cobra.Command{
		Use:   "purge [--dry-run]",
		Short: "Remove what has outlived the policy's retention (payloads, results, events)",
		Long: `purge removes effect and approval payloads, run results, validated values and the
ledgers of finished runs older than retention.payloads (default 30 days), and events
older than retention.events (default 400 days); hashes and ids stay. Expired sessions,
sign-in throttles and Idempotency-Key records go too, and the people seen by single
sign-on 90 days after their last sign-in (they no longer count as holders of a role).
Every serve does this every retention.interval (default 1h); --dry-run only says what it
would remove.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withPolicy(cmd, func(st store.Store, pol *policy.Policy) error {
				counts, err := retention.Purge(cmd.Context(), st, pol, time.Time{}, dry) // the database's clock
				if err != nil {
					return err
				}
				verb := "removed"
				if dry {
					verb = "would remove"
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintf(tw, "KIND\t%s\n", strings.ToUpper(verb))
				for _, k := range slices.Sorted(maps.Keys(counts)) {
					fmt.Fprintf(tw, "%s\t%d\n", k, counts[k])
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&dry, "dry-run", false, "count only; change nothing")
	return cmd
}
