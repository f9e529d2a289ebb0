package sqlite

// HotStatementsForTest are the statements whose cost must not grow with history: the
// report's, the effect counts' and every purge statement (dry and batched), each with
// how many arguments it takes.
func HotStatementsForTest() map[string]int {
	out := map[string]int{auditCountSQL: 1, auditRunsSQL: 1, auditEventsFor([]string{"alert", "validation"}): 3,
		auditEventsFor([]string{"claimed", "alert"}): 3, auditGateWaitsSQL: 1,
		`SELECT state, n FROM effect_counts WHERE n <> 0`: 0}
	for _, st := range purgeStatements {
		where := purgeWhere(st.where)
		out[`SELECT count(*) FROM `+st.table+` WHERE `+where] = 3
		out[purgeBatchSQL(st.table, st.set, where, st.order)] = 5
	}
	return out
}

// HotStatementIndexesForTest names, for the statements whose index 0023 narrowed, the
// index each must read: the report's details and gate waits, the purge's effect payloads.
func HotStatementIndexesForTest() map[string]string {
	out := map[string]string{auditEventsFor([]string{"alert", "validation"}): "events_report_kind_at", auditGateWaitsSQL: "events_report_kind_at"}
	for _, st := range purgeStatements {
		if st.kind == "effect_payloads" {
			where := purgeWhere(st.where)
			out[`SELECT count(*) FROM `+st.table+` WHERE `+where] = "effects_purge_at"
			out[purgeBatchSQL(st.table, st.set, where, st.order)] = "effects_purge_at"
		}
	}
	return out
}

// RunListSQLForTest is the statement RunList sends for p, with its arguments.
var RunListSQLForTest = runListSQL

// CachedStatementsForTest is how many prepared statements the connection c keeps.
func CachedStatementsForTest(c any) int { return len(c.(*conn).stmts.m) }
