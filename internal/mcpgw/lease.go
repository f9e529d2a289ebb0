package mcpgw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/client"
)

func (g *Gateway) run(runID string) *runState {
	g.mu.Lock()
	defer g.mu.Unlock()
	rs, ok := g.runs[runID]
	if !ok {
		rs = &runState{effect: make(chan struct{}, 1)}
		g.runs[runID] = rs
	}
	return rs
}

// drop forgets the lease on runID (parked, taken over or lost).
func (g *Gateway) drop(runID string) {
	rs := g.run(runID)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.stop != nil {
		rs.stop()
		rs.stop = nil
	}
	rs.owner = ""
}

// claim returns the lease owner of runID, claiming the run (creating it) if the gateway
// holds no lease. With wait, a run held by another process's live lease is claimed again
// until that lease lapses or Wait runs out; without, a run not claimed gives "".
func (g *Gateway) claim(ctx context.Context, runID string, wait bool) (string, error) {
	rs := g.run(runID)
	rs.claimMu.Lock()
	defer rs.claimMu.Unlock()
	rs.mu.Lock()
	owner := rs.owner
	rs.mu.Unlock()
	if owner != "" {
		return owner, nil
	}
	deadline := time.Now().Add(g.opts.Wait)
	for {
		c, err := g.opts.Client.Claim(ctx, client.ClaimRequest{Key: runID, Payload: map[string]string{"gateway": "mcp", "run_id": runID},
			LeaseSeconds: int(g.opts.Lease.Round(time.Second) / time.Second)})
		if err != nil {
			var ae *client.APIError
			if errors.As(err, &ae) {
				return "", refuse(ae.Code, "claim run %s: %s", runID, ae.Message)
			}
			return "", refuse("airlock_unavailable", "airlock could not be asked, so the call was not sent: %v", err)
		}
		if c.Claimed {
			g.hold(rs, runID, c)
			return c.LeaseOwner, nil
		}
		if !wait {
			return "", nil
		}
		switch c.State {
		case client.StateAwaitingHuman:
			return "", refuse("approval_pending", "run %s waits for a person (an approval, or a decision on an effect): nothing was done; call again after the decision. An approval's link was in the answer to the call that asked for it; an operator can re-issue it from the console", runID)
		case client.StateProcessing:
		default:
			return "", refuse("run_finished", "%s", finished(runID, c))
		}
		if time.Now().After(deadline) {
			return "", refuse("lease_held", "run %s is held by another process's lease (perhaps this agent's before it restarted); it lapses within the lease time: call again", runID)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// hold keeps the claimed lease alive until it is lost or the gateway stops.
func (g *Gateway) hold(rs *runState, runID string, c client.Claim) {
	g.mu.Lock()
	stopped := g.stopped
	g.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	rs.mu.Lock()
	rs.owner, rs.version, rs.stop = c.LeaseOwner, c.Version, cancel
	rs.mu.Unlock()
	if stopped {
		cancel()
		return
	}
	go func() {
		t := time.NewTicker(g.opts.Lease / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			_, err := g.opts.Client.Heartbeat(ctx, runID, client.HeartbeatRequest{LeaseOwner: c.LeaseOwner, Version: c.Version,
				LeaseSeconds: int(g.opts.Lease.Round(time.Second) / time.Second)})
			var ae *client.APIError
			if errors.As(err, &ae) && ctx.Err() == nil {
				g.opts.Log.Info("the run's lease ended", "run_id", runID, "code", ae.Code)
				rs.mu.Lock()
				if rs.owner == c.LeaseOwner {
					rs.owner, rs.stop = "", nil
				}
				rs.mu.Unlock()
				cancel()
				return
			}
		}
	}()
}

// finished says why a run takes no more effects; a rejected run names who rejected it and
// why, so the model can tell the user (the approver's reason is the point of a reject).
func finished(runID string, c client.Claim) string {
	var r struct {
		RejectedBy string `json:"rejected_by"`
		Reason     string `json:"reason"`
	}
	if c.State == client.StateRejected && json.Unmarshal(c.Result, &r) == nil && r.RejectedBy != "" {
		why := "no reason given"
		if strings.TrimSpace(r.Reason) != "" {
			why = strconv.Quote(r.Reason)
		}
		return fmt.Sprintf("run %s was rejected by %s (%s): no more effects are performed in it. Its action type ends the run on a reject (approval.on_reject: end_run)", runID, r.RejectedBy, why)
	}
	return fmt.Sprintf("run %s is %s: no more effects are performed in it", runID, c.State)
}
