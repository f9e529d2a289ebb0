// Package accounts is who may sign in to airlock's pages and for how long: local
// accounts (bcrypt password hashes, roles), the server-side sessions of people signed in
// (stored only as hashes of their ids), and the sign-in throttle. The pages
// (internal/web) and the CLI (airlock user) both act through it; it knows nothing of
// HTTP.
package accounts

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/bcrypt"

	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// Local accounts. A name or a role shows up on pages, in events and in approval rules:
// both are short, printable and free of markup. A change that affects what a person may
// do (disable, roles, password, removal) ends their sessions in the same transaction,
// and is recorded as a user_changed event with who made it.

var (
	userNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$`)
	roleRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}$`)
)

// ErrNoUser: no local account has that name.
var ErrNoUser = errors.New("no local account has that name")

// ValidUserName: 1–64 letters, digits and . _ @ + -, starting with a letter or digit.
func ValidUserName(name string) error {
	if !userNameRE.MatchString(name) {
		return fmt.Errorf("user name %q: use 1–64 letters, digits and . _ @ + -, starting with a letter or digit", name)
	}
	return nil
}

// ParseRoles reads a comma-separated role list: 1–64 letters, digits and . _ : / - each,
// at least one, duplicates dropped.
func ParseRoles(list string) ([]string, error) {
	var roles []string
	for _, r := range strings.Split(list, ",") {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		if !roleRE.MatchString(r) {
			return nil, fmt.Errorf("role %q: use 1–64 letters, digits and . _ : / -, starting with a letter or digit", r)
		}
		if !slices.Contains(roles, r) {
			roles = append(roles, r)
		}
	}
	if len(roles) == 0 {
		return nil, errors.New("at least one role is required")
	}
	return roles, nil
}

func hashPassword(password string) (string, error) {
	if len(password) < 12 {
		return "", errors.New("a password needs at least 12 characters")
	}
	if len(password) > 72 {
		return "", errors.New("a password may have at most 72 bytes (bcrypt reads no more)")
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	return string(h), err
}

// CreateUser adds a local account; the password is stored as a bcrypt hash.
func CreateUser(ctx context.Context, q store.Queries, name, password string, roles []string) error {
	if err := ValidUserName(name); err != nil {
		return err
	}
	roles, err := ParseRoles(strings.Join(roles, ","))
	if err != nil {
		return err
	}
	hash, err := hashPassword(password)
	if err != nil {
		return err
	}
	if _, err := q.UserByName(ctx, name); err == nil {
		return fmt.Errorf("a local account named %q exists already", name)
	}
	return q.UserInsert(ctx, store.User{ID: uuid.NewString(), Name: name, PasswordHash: hash, Roles: roles, CreatedAt: time.Now().UTC()})
}

// Accounts changes local accounts on behalf of an operator (Actor, e.g. cli:ana).
type Accounts struct {
	Store store.Store
	Actor string
}

func (a Accounts) update(ctx context.Context, p store.UserUpdateParams, change string) (store.User, error) {
	var u store.User
	err := a.Store.Transact(ctx, func(q store.Queries) error {
		var err error
		u, err = q.UserUpdate(ctx, p)
		if errors.Is(err, store.ErrNotFound) {
			return ErrNoUser
		}
		if err != nil {
			return err
		}
		return runs.Event(ctx, q, nil, runs.Entry{Kind: store.EventUserChanged, Actor: a.Actor, Detail: map[string]any{"user": u.Name, "change": change}})
	})
	return u, err
}

// Disable refuses the account's sign-ins and ends its sessions.
func (a Accounts) Disable(ctx context.Context, name string) (store.User, error) {
	yes := true
	return a.update(ctx, store.UserUpdateParams{Name: name, Disabled: &yes}, "disabled")
}

// Enable lets the account sign in again.
func (a Accounts) Enable(ctx context.Context, name string) (store.User, error) {
	no := false
	return a.update(ctx, store.UserUpdateParams{Name: name, Disabled: &no}, "enabled")
}

// SetRoles replaces the account's roles and ends its sessions.
func (a Accounts) SetRoles(ctx context.Context, name, list string) (store.User, error) {
	roles, err := ParseRoles(list)
	if err != nil {
		return store.User{}, err
	}
	return a.update(ctx, store.UserUpdateParams{Name: name, Roles: roles}, "roles:"+strings.Join(roles, ","))
}

// ResetPassword sets a new password and ends the account's sessions.
func (a Accounts) ResetPassword(ctx context.Context, name, password string) (store.User, error) {
	hash, err := hashPassword(password)
	if err != nil {
		return store.User{}, err
	}
	return a.update(ctx, store.UserUpdateParams{Name: name, PasswordHash: &hash}, "password_reset")
}

// Remove deletes the account and its sessions.
func (a Accounts) Remove(ctx context.Context, name string) error {
	return a.Store.Transact(ctx, func(q store.Queries) error {
		err := q.UserDelete(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			return ErrNoUser
		}
		if err != nil {
			return err
		}
		return runs.Event(ctx, q, nil, runs.Entry{Kind: store.EventUserChanged, Actor: a.Actor, Detail: map[string]any{"user": name, "change": "removed"}})
	})
}
