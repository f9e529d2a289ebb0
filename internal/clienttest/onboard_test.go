package clienttest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlockhq/airlock/client"
)

// onboard is docs/agents.md's agent: three side effects, one of them gated, each done
// exactly once however often the process is killed. provider is a directory playing the
// external system; wait is how long the gated step waits for its approval.
func onboard(ctx context.Context, c *client.Client, key, provider string, wait time.Duration, hook func(string, client.StepCall)) error {
	run, err := c.OpenRun(ctx, key, map[string]string{"customer": "alice"}, client.RunOptions{Goal: "Onboard alice",
		Steps: []string{"draft", "crm", "share"}, LeaseSeconds: 2, WaitApproval: wait, Hook: hook})
	if err != nil || run.Finished {
		return err
	}
	defer run.Close()
	write := func(ctx context.Context, s client.StepCall) (string, error) { // one record per call; its id is the receipt
		id := fmt.Sprintf("%s-%d", s.Action, time.Now().UnixNano())
		b, _ := json.Marshal(map[string]any{"run": s.Key, "effect": s.EffectID, "input": s.Input})
		return id, os.WriteFile(filepath.Join(provider, id), b, 0o600)
	}
	find := client.Lookup(func(ctx context.Context, s client.StepCall) (ids []string, err error) { // the records this effect may have left
		files, err := os.ReadDir(provider)
		for _, f := range files {
			b, _ := os.ReadFile(filepath.Join(provider, f.Name()))
			if strings.Contains(string(b), fmt.Sprintf(`"effect":%q`, s.EffectID)) && strings.Contains(string(b), fmt.Sprintf(`"run":%q`, s.Key)) {
				ids = append(ids, f.Name())
			}
		}
		return ids, err
	})
	doc, err := run.Step(ctx, "draft", "create_doc", "docs", map[string]string{"title": "Welcome, Alice"}, write, find)
	if err == nil {
		_, err = run.Step(ctx, "crm", "crm_note", "crm", map[string]string{"customer": "alice", "note": "onboarding"}, write, find)
	}
	if err == nil {
		_, err = run.Step(ctx, "share", "share_doc", "team", map[string]string{"doc": doc.Receipt, "with": "alice@example.com"}, write, find)
	}
	if err == nil {
		_, err = run.Complete(ctx, map[string]string{"doc": doc.Receipt})
	}
	return err
}
