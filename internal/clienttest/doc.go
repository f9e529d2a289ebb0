// Package clienttest holds the Go client's tests and runnable examples. The client
// (github.com/airlockhq/airlock/client) is a module of its own so that an agent using
// it pulls no server dependency; its tests run it against a real airlock built from
// this module (internal/airlocktest, both stores), so they live here, in the server's
// module.
package clienttest
