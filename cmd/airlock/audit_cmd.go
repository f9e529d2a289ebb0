package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

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

func auditCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Check the record airlock keeps",
	}
	cmd.AddCommand(auditVerifyCmd(), auditKeygenCmd(), auditCheckpointCmd())
	return cmd
}

func auditKeygenCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "keygen --out FILE",
		Short: "Create an audit key: events are sealed with a MAC under it, checkpoints signed with it",
		Long: `keygen writes a new audit key (32 random bytes) to FILE, readable by its owner only
(0600), and refuses to overwrite a file that exists. Point AIRLOCK_AUDIT_KEY_FILE at it
on every instance, and keep a copy where the database's administrators cannot reach it:
whoever holds the key can forge what verify accepts (docs/operations.md#audit-keys).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return errors.New("give the key file with --out FILE")
			}
			k, err := store.NewAuditKey()
			if err != nil {
				return err
			}
			f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if errors.Is(err, os.ErrExist) {
				return fmt.Errorf("%s exists: keygen never overwrites a key (events sealed with it could no longer be verified)", out)
			}
			if err != nil {
				return fmt.Errorf("create %s: %w", out, errors.Unwrap(err))
			}
			if _, err := f.Write(k.Encode()); err != nil {
				f.Close()
				return fmt.Errorf("write %s: %w", out, err)
			}
			if err := f.Sync(); err != nil {
				f.Close()
				return fmt.Errorf("write %s: %w", out, err)
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("write %s: %w", out, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote audit key %s to %s\n", k.ID(), out)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "the key file to create (0600; never overwritten)")
	return cmd
}

func auditCheckpointCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "checkpoint [--dir DIR]",
		Short: "Write a signed checkpoint of every run's chain head now",
		Long: `checkpoint reads every run's chain head and writes them, signed with the audit key
(AIRLOCK_AUDIT_KEY_FILE), as one new file in DIR (default AIRLOCK_AUDIT_CHECKPOINT_DIR),
atomically. serve writes one every AIRLOCK_AUDIT_CHECKPOINT_INTERVAL and after every
approval decision; verify --checkpoints DIR holds the chains to the newest
(docs/operations.md#checkpoints).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			key, err := auditKey(cfg)
			if err != nil {
				return err
			}
			if key == nil {
				return errors.New("a checkpoint is signed with the audit key: set AIRLOCK_AUDIT_KEY_FILE (airlock audit keygen)")
			}
			if dir == "" {
				dir = cfg.AuditCheckpointDir
			}
			if dir == "" {
				return errors.New("give the checkpoint directory with --dir or AIRLOCK_AUDIT_CHECKPOINT_DIR")
			}
			return withStore(cmd, func(st store.Store) error {
				c, err := audit.New(st, nil).TakeCheckpoint(cmd.Context(), key)
				if err != nil {
					return err
				}
				name, err := audit.WriteCheckpoint(dir, c)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d runs\n", name, len(c.Runs))
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the checkpoint directory (default: AIRLOCK_AUDIT_CHECKPOINT_DIR)")
	return cmd
}

// verifyKeys is the keyring verify checks MACs with: the configured key and every
// --key-file (keys kept from before a rotation).
func verifyKeys(cmd *cobra.Command, files []string) (store.Keyring, error) {
	cfg, err := loadConfig(cmd)
	if err != nil {
		return nil, err
	}
	var keys []*store.AuditKey
	if k, err := auditKey(cfg); err != nil {
		return nil, err
	} else if k != nil {
		keys = append(keys, k)
	}
	for _, f := range files {
		k, err := store.ReadAuditKey(f)
		if err != nil {
			return nil, fmt.Errorf("--key-file: %w", err)
		}
		keys = append(keys, k)
	}
	return store.NewKeyring(keys...), nil
}

// errChainBroken is verify's failure: its output already names the run and the event.
var errChainBroken = errors.New("the hash chain is broken")

func auditVerifyCmd() *cobra.Command {
	var all, asJSON, requireMAC bool
	var keyFiles []string
	var checkpoints string
	cmd := &cobra.Command{
		Use:   "verify [KEY|--all] [--json] [--key-file FILE …] [--require-mac] [--checkpoints DIR]",
		Short: "Check runs' event hash chains: a changed, deleted or reordered event is found",
		Long: `verify recomputes the hash chain of a run's events (docs/operations.md#the-event-hash-chain):
each event's hash covers the previous event's hash and its own content (id, key, time,
kind, version, actor, meta, detail), and the run's head in event_chains names the last.
It prints one line per run and exits non-zero naming the first bad event when an event
was changed, deleted, reordered or written around the chain.

Events written before the chain began (before migration 0015) are counted as
"unchained before event N": nothing proves them. --all checks every run, in key order.

With the audit key (AIRLOCK_AUDIT_KEY_FILE, and --key-file for keys kept from before a
rotation; repeatable) every event's MAC is checked too: an event inserted or rewritten
with SQL fails, wherever it is in the chain. Events written before the key was set are
counted as unkeyed (a failure only with --require-mac); an event without a MAC after the
first keyed one is a failure.

With --checkpoints DIR, every chain is held to every signed checkpoint there (each head
any of them recorded must still be in the chain, at that link with that hash): the
newest events deleted and the head set back, a rollback to an earlier state, a run wiped whole (--all names it from the
checkpoint and the runs table), a retention base moved or set back are found for
everything the checkpoint covered. A retention base is accepted only when its link is
older than the policy's retention.events (--config) and, with the key, sealed by the purge.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) == 1) && len(args) <= 1 {
				return errors.New("give one KEY or --all")
			}
			return cobra.MaximumNArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := verifyKeys(cmd, keyFiles)
			if err != nil {
				return err
			}
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			pol, err := loadPolicyWithoutSecrets(cfg)
			if err != nil {
				return err
			}
			opt := audit.VerifyOptions{Keys: keys, RequireMAC: requireMAC, Retention: pol.Retention.Events.D()}
			if checkpoints != "" {
				if len(keys) == 0 {
					return errors.New("--checkpoints needs the audit key they are signed with: AIRLOCK_AUDIT_KEY_FILE or --key-file")
				}
				set, err := audit.LoadCheckpoints(checkpoints, keys)
				if err != nil {
					return err
				}
				opt.Checkpoints = set
				fmt.Fprintf(cmd.ErrOrStderr(), "airlock: checkpoints: %d in %s (newest %s, %s, %d runs; %d distinct run heads held)\n",
					set.Files, checkpoints, filepath.Base(set.NewestFile), set.Newest.WrittenAt.Format(time.RFC3339), len(set.Newest.Runs), set.States)
			}
			return withStore(cmd, func(st store.Store) error {
				svc := audit.New(st, nil)
				if len(keys) > 0 {
					if opt.KeyedSince, err = st.ChainFirstKeyed(cmd.Context()); err != nil {
						return err
					}
					if opt.Checkpoints != nil && opt.Checkpoints.KeyedSince > 0 &&
						(opt.KeyedSince == 0 || opt.Checkpoints.KeyedSince < opt.KeyedSince) {
						opt.KeyedSince = opt.Checkpoints.KeyedSince // MACs erased since
					}
				} else if requireMAC {
					return errors.New("--require-mac needs the audit key: AIRLOCK_AUDIT_KEY_FILE or --key-file")
				}
				out := cmd.OutOrStdout()
				bad, total := 0, 0
				report := func(c audit.ChainCheck) error {
					total++
					if !c.OK {
						bad++
					}
					if asJSON {
						return json.NewEncoder(out).Encode(c)
					}
					return audit.WriteChainCheck(out, c)
				}
				if all {
					if err := svc.VerifyAllWith(cmd.Context(), opt, report); err != nil {
						return err
					}
					if !asJSON {
						fmt.Fprintf(out, "%d runs checked, %d broken\n", total, bad)
					}
				} else {
					c, err := svc.VerifyChainWith(cmd.Context(), args[0], opt)
					if errors.Is(err, audit.ErrNoEvents) {
						return fmt.Errorf("no events have the key %q", args[0])
					}
					if err != nil {
						return err
					}
					if err := report(c); err != nil {
						return err
					}
				}
				if bad > 0 {
					return errChainBroken
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "check every run")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per run")
	cmd.Flags().StringArrayVar(&keyFiles, "key-file", nil, "an audit key to check MACs with, besides AIRLOCK_AUDIT_KEY_FILE (repeat for keys kept from before a rotation)")
	cmd.Flags().BoolVar(&requireMAC, "require-mac", false, "fail on any event without a MAC")
	cmd.Flags().StringVar(&checkpoints, "checkpoints", "", "hold the chains to every signed checkpoint in this directory")
	return cmd
}
