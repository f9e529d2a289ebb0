package clienttest

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// listPolicy gates two agent-executed types: one a held role may decide (team-lead, given
// to an account below), one for a role nobody holds (legal): undecidable from the start.
const listPolicy = gatedPolicy + `
  share_legal:
    connector: worker
    approvers: {roles: [legal]}
`

// TestApprovalsList: Client.Approvals pages GET /v1/approvals newest first; Undecidable
// keeps the approvals nobody known can decide; rows carry no token; runs keys are
// refused and a bad cursor or limit is invalid_field. On both stores.
func TestApprovalsList(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			srv := start(t, b, listPolicy, "team-lead")
			c, op := srv.c, srv.op

			var keys []string
			links := map[string]string{}
			for i, action := range []string{"share_publicly", "share_legal", "share_legal"} {
				key := []string{"lead-1", "legal-1", "legal-2"}[i]
				cl := claim(t, c, key)
				q, err := c.QueueEffect(ctx, key, client.QueueEffectRequest{LeaseOwner: cl.LeaseOwner, Version: cl.Version,
					ActionType: action, Target: "everyone", Payload: map[string]string{"k": key}, EffectID: "e1"})
				if err != nil || q.Approval == nil {
					t.Fatalf("queue %s: %+v, %v", action, q, err)
				}
				keys = append([]string{key}, keys...) // newest first
				links[key] = q.Approval.ApproveURL
			}

			var seen []client.PendingApproval
			after := ""
			for pages := 0; ; pages++ {
				if pages == 10 {
					t.Fatalf("the pages never end: %d rows", len(seen))
				}
				page, next, err := op.Approvals(ctx, client.ApprovalsFilter{Limit: 1, After: after})
				if err != nil || len(page) > 1 {
					t.Fatalf("page %d: %+v, %v", pages, page, err)
				}
				seen = append(seen, page...)
				if after = next; after == "" {
					break
				}
			}
			var got []string
			for _, a := range seen {
				got = append(got, a.Key)
				token := links[a.Key][strings.LastIndex(links[a.Key], "/")+1:]
				if a.Mode != "approve_before_act" || a.Target != "everyone" || a.CreatedAt.IsZero() || !a.ExpiresAt.After(a.CreatedAt) ||
					!strings.HasSuffix(a.ConsoleURL, "/console/approvals/"+a.ID) || strings.Contains(a.ConsoleURL, token) {
					t.Fatalf("row: %+v", a)
				}
				if stuck := a.UndecidableSince != nil; stuck != strings.HasPrefix(a.Key, "legal") {
					t.Fatalf("%s: undecidable_since %v", a.Key, a.UndecidableSince)
				}
			}
			if !reflect.DeepEqual(got, keys) {
				t.Fatalf("pages = %v, want %v", got, keys)
			}
			if seen[2].ApproverRoles[0] != "team-lead" || seen[0].ApproverRoles[0] != "legal" {
				t.Fatalf("roles: %+v", seen)
			}

			stuck, next, err := op.Approvals(ctx, client.ApprovalsFilter{Undecidable: true})
			got = nil
			for _, a := range stuck {
				got = append(got, a.Key)
			}
			if err != nil || next != "" || !slices.Equal(got, []string{"legal-2", "legal-1"}) {
				t.Fatalf("undecidable = %v (next %q), %v", got, next, err)
			}
			first, next, err := op.Approvals(ctx, client.ApprovalsFilter{Undecidable: true, Limit: 1})
			if err != nil || len(first) != 1 || first[0].Key != "legal-2" || next == "" {
				t.Fatalf("first undecidable page: %+v %q, %v", first, next, err)
			}
			second, _, err := op.Approvals(ctx, client.ApprovalsFilter{Undecidable: true, Limit: 1, After: next})
			if err != nil || len(second) != 1 || second[0].Key != "legal-1" {
				t.Fatalf("second undecidable page: %+v, %v", second, err)
			}

			_, _, err = c.Approvals(ctx, client.ApprovalsFilter{})
			wantCode(t, err, 403, "forbidden")
			for _, bad := range []client.ApprovalsFilter{{Limit: 501}, {Limit: -1}, {After: "x"}} {
				_, _, err = op.Approvals(ctx, bad)
				wantCode(t, err, 400, "invalid_field")
			}
		})
	}
}
