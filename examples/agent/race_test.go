//go:build race

package main

// Under the race detector the agent binary is built with it too.
func init() { buildFlags = append(buildFlags, "-race") }
