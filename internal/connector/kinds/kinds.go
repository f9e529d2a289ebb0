// Package kinds is the one table of connector kinds: the `connector:` values an action
// type may name, each a connector.Kind supplied by its own package. The policy file
// decodes, defaults and validates a kind's section through its row; the connector, the
// approval card, the console's provider hint and the notification's words all come from
// the section the row decoded. Adding a kind is one package and one row here (see
// docs/architecture.md, "Adding a connector kind").
package kinds

import (
	"fmt"
	"strings"
	"sync"

	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/connector/httpconn"
	"github.com/airlockhq/airlock/internal/connector/smtpconn"
)

var (
	mu sync.RWMutex
	// table is the kinds in the order the policy file's messages list them.
	table = []connector.Kind{
		httpconn.Kind,
		smtpconn.Kind,
		connector.Worker,
	}
)

// Register adds a kind to the table (a build that carries one more, or a test). It
// panics when the kind lacks a name or a section, or its name is taken: a
// misconfigured build fails at start, as caddy's RegisterModule does.
func Register(k connector.Kind) {
	if k.Name == "" || k.NewSection == nil {
		panic("kinds: a kind needs a Name and a NewSection")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, have := range table {
		if have.Name == k.Name {
			panic(fmt.Sprintf("kinds: kind %q is already registered", k.Name))
		}
	}
	table = append(table, k)
}

// Lookup returns the kind named name.
func Lookup(name string) (connector.Kind, bool) {
	mu.RLock()
	defer mu.RUnlock()
	for _, k := range table {
		if k.Name == name {
			return k, true
		}
	}
	return connector.Kind{}, false
}

// Names are the kinds' names in table order.
func Names() []string {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]string, len(table))
	for i, k := range table {
		out[i] = k.Name
	}
	return out
}

// List is the names as a message lists them: "http, smtp or worker".
func List() string {
	n := Names()
	if len(n) == 1 {
		return n[0]
	}
	return strings.Join(n[:len(n)-1], ", ") + " or " + n[len(n)-1]
}
