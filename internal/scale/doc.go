// Package scale is test-only: its tests measure and bound airlock's cost as data grows —
// the effects-by-state counters and the batched purge on every backend (cost_test.go),
// EXPLAINed hot statements on PostgreSQL with generated history (explain_test.go), index
// entries per operation read from the WAL (index_entries_test.go), and the scale and
// console benchmarks (scale_test.go, console_scale_test.go). Its one non-test part,
// HotOperations and the console's lists, is what those tests and internal/app's Citus
// plan tests replay. Nothing outside tests imports it.
package scale
