package audit

import (
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// BenchmarkLoadCheckpoints measures what verify --checkpoints reads before it checks a
// run: a day of checkpoints at the default interval (288 files) over 1,000 runs, each
// file read, parsed and its signature checked, with 10 runs' heads moving between two
// files (the rest idle, kept once).
func BenchmarkLoadCheckpoints(b *testing.B) {
	key, err := store.NewAuditKey()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	const files, runs, moving = 288, 1000, 10
	start := time.Now().Add(-24 * time.Hour)
	for f := range files {
		c := Checkpoint{Format: CheckpointFormat, WrittenAt: start.Add(time.Duration(f) * 5 * time.Minute), KeyedSince: 1}
		for r := range runs {
			seq := int64(5)
			if r < moving {
				seq += int64(f)
			}
			c.Runs = append(c.Runs, CheckpointRun{Key: fmt.Sprintf("run-%06d", r), Seq: seq, Head: fmt.Sprintf("%064x", int64(r)*1000+seq)})
		}
		body, err := c.body()
		if err != nil {
			b.Fatal(err)
		}
		c.KeyID, c.Signature = key.ID(), hex.EncodeToString(key.Sum("airlock checkpoint v1", body))
		if _, err := WriteCheckpoint(dir, c); err != nil {
			b.Fatal(err)
		}
	}
	keys := store.NewKeyring(key)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		set, err := LoadCheckpoints(dir, keys)
		if err != nil {
			b.Fatal(err)
		}
		if want := runs - moving + moving*files; set.Files != files || set.States != want {
			b.Fatalf("%d files, %d states; want %d, %d", set.Files, set.States, files, want)
		}
	}
}
