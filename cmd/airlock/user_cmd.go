package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/internal/accounts"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/slack"
	"github.com/airlockhq/airlock/internal/store"
)

// readPassword takes AIRLOCK_USER_PASSWORD, else the first line of stdin.
func readPassword(cmd *cobra.Command) (string, error) {
	if p, ok := os.LookupEnv("AIRLOCK_USER_PASSWORD"); ok {
		return p, nil
	}
	line, err := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
	if err != nil && line == "" {
		return "", errors.New("give the password on stdin or in AIRLOCK_USER_PASSWORD")
	}
	return strings.TrimRight(line, "\r\n"), nil
}

func userCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "user",
		Short: "Local accounts for people who approve (the embedded default's sign-in)",
		Long: `Local accounts sign in on airlock's pages to decide approvals. Names are 1–64 letters,
digits and . _ @ + -; roles 1–64 letters, digits and . _ : / -. Disabling an account,
changing its roles or its password, or removing it ends its sessions at once. Every
change is an event (user_changed) with who made it.`,
	}
	accountsOf := func(st store.Store) accounts.Accounts { return accounts.Accounts{Store: st, Actor: cliActor()} }
	notFound := func(name string, err error) error {
		if errors.Is(err, accounts.ErrNoUser) {
			return fmt.Errorf("no local account is named %q", name)
		}
		return err
	}

	var roles string
	add := &cobra.Command{
		Use:   "add NAME --role ROLE[,ROLE]",
		Short: "Add a local account; the password is read from AIRLOCK_USER_PASSWORD or the first line of stdin",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := accounts.ValidUserName(args[0]); err != nil {
				return err
			}
			rs, err := accounts.ParseRoles(roles)
			if err != nil {
				return fmt.Errorf("--role: %w", err)
			}
			password, err := readPassword(cmd)
			if err != nil {
				return err
			}
			return withStore(cmd, func(st store.Store) error {
				if err := accounts.CreateUser(cmd.Context(), st, args[0], password, rs); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "added %s with roles %s\n", args[0], strings.Join(rs, ","))
				return nil
			})
		},
	}
	add.Flags().StringVar(&roles, "role", "", "comma-separated roles, e.g. support-lead (required)")
	_ = add.MarkFlagRequired("role")

	list := &cobra.Command{
		Use:   "list",
		Short: "List local accounts (never their password hashes)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(cmd, func(st store.Store) error {
				us, err := st.UserList(cmd.Context())
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tROLES\tCREATED\tDISABLED")
				for _, u := range us {
					disabled := "-"
					if u.DisabledAt != nil {
						disabled = u.DisabledAt.UTC().Format(time.RFC3339)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", u.Name, strings.Join(u.Roles, ","), u.CreatedAt.UTC().Format(time.RFC3339), disabled)
				}
				return tw.Flush()
			})
		},
	}

	change := func(use, short, done string, fn func(cmd *cobra.Command, a accounts.Accounts, name string) error) *cobra.Command {
		return &cobra.Command{
			Use:   use,
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return withStore(cmd, func(st store.Store) error {
					if err := fn(cmd, accountsOf(st), args[0]); err != nil {
						return notFound(args[0], err)
					}
					fmt.Fprintln(cmd.OutOrStdout(), done, args[0])
					return nil
				})
			},
		}
	}
	disable := change("disable NAME", "Refuse the account's sign-ins and end its sessions now", "disabled",
		func(cmd *cobra.Command, a accounts.Accounts, name string) error {
			_, err := a.Disable(cmd.Context(), name)
			return err
		})
	enable := change("enable NAME", "Let a disabled account sign in again", "enabled",
		func(cmd *cobra.Command, a accounts.Accounts, name string) error {
			_, err := a.Enable(cmd.Context(), name)
			return err
		})
	remove := change("remove NAME", "Delete the account and end its sessions now", "removed",
		func(cmd *cobra.Command, a accounts.Accounts, name string) error { return a.Remove(cmd.Context(), name) })
	var newRoles string
	setRoles := change("set-roles NAME --role ROLE[,ROLE]", "Replace the account's roles and end its sessions now", "roles set for",
		func(cmd *cobra.Command, a accounts.Accounts, name string) error {
			_, err := a.SetRoles(cmd.Context(), name, newRoles)
			return err
		})
	setRoles.Flags().StringVar(&newRoles, "role", "", "comma-separated roles (required)")
	_ = setRoles.MarkFlagRequired("role")
	reset := change("reset-password NAME", "Set a new password (AIRLOCK_USER_PASSWORD or stdin) and end the account's sessions now", "password reset for",
		func(cmd *cobra.Command, a accounts.Accounts, name string) error {
			password, err := readPassword(cmd)
			if err != nil {
				return err
			}
			_, err = a.ResetPassword(cmd.Context(), name, password)
			return err
		})
	cmd.AddCommand(add, list, disable, enable, remove, setRoles, reset, linkSlackCmd(), unlinkSlackCmd())
	return cmd
}

// slackID is a Slack team or user id as Slack signs it (T0123ABCD, U0123ABCD, W…).
var slackID = regexp.MustCompile(`^[A-Z0-9]{2,32}$`)

func slackIDs(team, user string) error {
	if !slackID.MatchString(team) || !slackID.MatchString(user) {
		return errors.New("--team and --user are Slack ids such as T0123ABCD and U0123ABCD (in Slack: the member's profile, Copy member ID)")
	}
	return nil
}

func linkSlackCmd() *cobra.Command {
	var team, user string
	var sso bool
	cmd := &cobra.Command{
		Use:   "link-slack NAME --team T… --user U…",
		Short: "Link a Slack user to an airlock person: their clicks on Slack decision buttons decide as that person",
		Long: `Links the Slack user (team and user id, as Slack signs them) to the airlock person NAME:
a local account (its current roles apply at each click; disabling or removing it ends
what the link can do), or with --sso a single sign-on subject (the roles of their last
sign-in apply, if it was within 12 hours). A person can also link themselves: the
console's Link Slack page gives a one-time code for /airlock link CODE in Slack.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := slackIDs(team, user); err != nil {
				return err
			}
			return withStore(cmd, func(st store.Store) error {
				account := ""
				u, err := st.UserByName(cmd.Context(), args[0])
				switch {
				case err == nil && sso:
					return fmt.Errorf("%q is a local account: link it without --sso", args[0])
				case err == nil:
					account = u.ID
				case errors.Is(err, store.ErrNotFound) && !sso:
					return fmt.Errorf("no local account is named %q (a single sign-on person: add --sso)", args[0])
				case !errors.Is(err, store.ErrNotFound):
					return err
				}
				s, err := slack.New(runs.Base{Store: st}, slack.Config{})
				if err != nil {
					return err
				}
				if err := s.Link(cmd.Context(), team, user, args[0], account, cliActor()); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "linked slack:%s/%s to %s\n", team, user, args[0])
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&team, "team", "", "the Slack workspace's team id, e.g. T0123ABCD (required)")
	cmd.Flags().StringVar(&user, "user", "", "the Slack member id, e.g. U0123ABCD (required)")
	cmd.Flags().BoolVar(&sso, "sso", false, "NAME is a single sign-on subject, not a local account")
	_ = cmd.MarkFlagRequired("team")
	_ = cmd.MarkFlagRequired("user")
	return cmd
}

func unlinkSlackCmd() *cobra.Command {
	var team, user string
	cmd := &cobra.Command{
		Use:   "unlink-slack --team T… --user U…",
		Short: "Remove a Slack user's link: their clicks decide nothing any more",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := slackIDs(team, user); err != nil {
				return err
			}
			return withStore(cmd, func(st store.Store) error {
				s, err := slack.New(runs.Base{Store: st}, slack.Config{})
				if err != nil {
					return err
				}
				err = s.Unlink(cmd.Context(), team, user, cliActor())
				if errors.Is(err, store.ErrNotFound) {
					return fmt.Errorf("slack:%s/%s is not linked", team, user)
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "unlinked slack:%s/%s\n", team, user)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&team, "team", "", "the Slack team id (required)")
	cmd.Flags().StringVar(&user, "user", "", "the Slack member id (required)")
	_ = cmd.MarkFlagRequired("team")
	_ = cmd.MarkFlagRequired("user")
	return cmd
}
