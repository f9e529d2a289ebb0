package effects_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// requeueCensus lists every place in airlock's code that can make an effect sendable —
// queue it, lease it, or put it back in pending or planned — with the tests that force a
// stale or concurrent writer against it and show that it loses, and those that fail its
// transaction or lose its reply after the commit (faultTests, storetest.Faults) and show
// that it applies once. TestRequeueCensus finds
// the places in the source itself: a new one without an entry here fails it, and so does
// an entry whose place or test is gone. The tests are entries of the domain packages'
// suites (this package's requeue, outbox, fault and effects tests, the ledger's and
// the failures' suites), each run on every
// backend.
var requeueCensus = map[string][]string{
	// Queued: new rows only; a second queue of the same (run, effect id) returns the first.
	// Outbox.Enter is the one way in: a request (Submit) and an approval (DecideBy →
	// Outbox.Approved) both reach it.
	"effects.Enter":           {"QueueUnderLease", "QueueReplyLostQueuesOnce", "ApprovalDecidedTwiceQueuesOnce", "ApprovalReplyLostQueuesOnce"},
	"ledger.planNew":          {"PlanConfirmNeverTwice"},
	"postgres.EffectInsert":   {"QueueUnderLease"},
	"sqlite.EffectInsert":     {"QueueUnderLease"},
	"postgres.leaseStatement": {"ConcurrentDispatchersSendOnce", "LeaseReplyLostIsRequeued", "WorkerReplyLostNeverHandsOutTwice"},
	"sqlite.lease":            {"ConcurrentDispatchersSendOnce", "LeaseReplyLostIsRequeued", "WorkerReplyLostNeverHandsOutTwice"},
	// EffectLease's form on a Citus coordinator (a compare-and-set per shard); these run
	// on Citus under scripts/with-citus.sh (docs/testing.md).
	"postgres.effectLeaseCitus":    {"ConcurrentDispatchersSendOnce", "LeaseReplyLostIsRequeued", "WorkerReplyLostNeverHandsOutTwice"},
	"postgres.EffectUpdate":        {"UnfencedRequeueIsRefused"},
	"sqlite.EffectUpdate":          {"UnfencedRequeueIsRefused"},
	"postgres.EffectRequeueFailed": {"RequeueFailedOnlyTakesFailed", "RequeueFailedReplyLostQueuesOnce"},
	"sqlite.EffectRequeueFailed":   {"RequeueFailedOnlyTakesFailed", "RequeueFailedReplyLostQueuesOnce"},
	// Back to pending, fenced by the lease that tried (its owner is never reused).
	"effects.planOutcome": {"StaleRetryOutcomeLoses", "GroupOutcomeFaultsRecordEachOutcomeOnce"}, // finishIn and the batch of record.go apply its plan
	// The grouped outcome statement (SET state = u.state: a retry's pending among them),
	// fenced like each outcome by the lease owner; A's stale 503 goes through it on PostgreSQL.
	"postgres.effectUpdateManyStatement": {"StaleRetryOutcomeLoses", "GroupOutcomeFaultsRecordEachOutcomeOnce"},
	"effects.block":                      {"KillSwitchThatCommitsFirstWins", "KillSwitchHoldReplyLostHoldsOnce"},
	"effects.requeueUnsent":              {"SweeperCannotRequeueABegunSend", "SweepReplyLostChangesTheEffectOnce", "BeginMarkFailedIsRequeued"},
	// Back to pending by a decision on a row read earlier, fenced by its version.
	"effects.reconcileOne": {"StaleReconcileAnswerLoses", "TwoInstancesNeverLookUpTheSameEffect", "LookupInFlightLosesToAnOperator", "ReconcileReplyLostAppliesOnce"},
	"effects.Resolve":      {"OperatorDecisionOnAChangedEffectIsRefused", "LookupInFlightLosesToAnOperator", "ResolveReplyLostAppliesOnce"},
	// An agent's ledger: fenced by the run's lease and the version read under it.
	"ledger.Plan":      {"AgentReconcileNeedsTheLease"},
	"ledger.Reconcile": {"AgentReconcileNeedsTheLease"},
}

var (
	sendableConst = map[string]bool{"EffectPending": true, "EffectPlanned": true, "EffectSending": true}
	setStateRe    = regexp.MustCompile(`(?is)UPDATE\s+effects\b.*?\bSET\s+state\s*=\s*('(\w+)'|[$?]\d+|[\w.]+)`)
	insertRe      = regexp.MustCompile(`(?i)INSERT\s+INTO\s+effects\b`)
)

// sendableSites returns the functions of the non-test Go files under root that make an
// effect sendable, as "package.Func".
func sendableSites(t *testing.T, root string) map[string]bool {
	t.Helper()
	sites := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "storetest" || d.Name() == "apptest" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		pkg := f.Name.Name
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			if found := sendableIn(pkg, fn); found {
				sites[pkg+"."+fn.Name.Name] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sites
}

// sendableIn reports whether fn writes an effect into a sendable state: a store constant
// for pending, planned or sending used as a value (not compared, not a From state), or,
// in a backend, SQL that inserts effects or sets their state to one of those, to a
// parameter or to any other expression (the grouped statement's u.state).
func sendableIn(pkg string, fn *ast.FuncDecl) bool {
	found := false
	var stack []ast.Node
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return false
		}
		stack = append(stack, n)
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok && x.Name == "store" && sendableConst[n.Sel.Name] && usedAsValue(stack) {
				found = true
			}
		case *ast.BasicLit:
			if n.Kind != token.STRING || (pkg != "postgres" && pkg != "sqlite") {
				break
			}
			s, err := strconv.Unquote(n.Value)
			if err != nil {
				break
			}
			if insertRe.MatchString(s) {
				found = true
			}
			for _, m := range setStateRe.FindAllStringSubmatch(s, -1) {
				if m[2] == "" || sendableConst["Effect"+strings.ToUpper(m[2][:1])+m[2][1:]] {
					found = true
				}
			}
		}
		return true
	})
	return found
}

// usedAsValue: the selector at the top of stack is not compared, not a case, and not in
// a From list.
func usedAsValue(stack []ast.Node) bool {
	for i := len(stack) - 2; i >= 0; i-- {
		switch p := stack[i].(type) {
		case *ast.BinaryExpr:
			if p.Op == token.EQL || p.Op == token.NEQ {
				return false
			}
		case *ast.CaseClause:
			return false
		case *ast.KeyValueExpr:
			if k, ok := p.Key.(*ast.Ident); ok && k.Name == "From" {
				return false
			}
		case *ast.CallExpr:
			if sel, ok := p.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Contains" {
				return false
			}
		case ast.Stmt:
			return true
		}
	}
	return true
}

// suiteTestNames are the names (without "Test") of every top-level test in the tests of
// the domain packages (this one and its siblings approvals, failures and ledger).
func suiteTestNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	var files []string
	for _, dir := range []string{".", "../approvals", "../failures", "../ledger"} {
		matched, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, matched...)
	}
	entry := regexp.MustCompile(`(?m)^func Test(\w+)\(t \*testing\.T\)`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range entry.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
	}
	return names
}

func TestRequeueCensus(t *testing.T) {
	sites := sendableSites(t, "..") // internal/
	names := suiteTestNames(t)
	for _, site := range slices.Sorted(maps.Keys(sites)) {
		tests, ok := requeueCensus[site]
		if !ok {
			t.Errorf("%s makes an effect sendable and has no entry in requeueCensus: add a test that forces a stale or concurrent writer against it (requeue_test.go) and list it", site)
			continue
		}
		for _, name := range tests {
			if !names[name] {
				t.Errorf("requeueCensus[%s] names %q, which is no suite entry of the domain packages' tests", site, name)
			}
		}
	}
	for site := range requeueCensus {
		if !sites[site] {
			t.Errorf("requeueCensus lists %s, which no longer makes an effect sendable (or was renamed): update the census", site)
		}
	}
	if len(sites) < 10 {
		t.Fatalf("the census found only %d places: its search is broken (%v)", len(sites), sites)
	}
}
