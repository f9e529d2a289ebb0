package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Document is one record of the (file-backed) document system: a document ("doc"), a
// note on one ("note") or a share of one ("share").
type Document struct {
	ID    string `json:"id"`
	Kind  string `json:"kind"`
	RunID string `json:"run_id"`
	// Key is the idempotency key of the agent's step that created it ("<run>/<step>"):
	// what a restarted agent searches by.
	Key   string `json:"key"`
	Title string `json:"title"`
	Body  string `json:"body"`
}

// Receipt is how the ledger refers to the record ("doc://doc-…"): checkable by anyone
// with access to the document system.
func (d Document) Receipt() string { return d.Kind + "://" + d.ID }

// Docs is the document system: a directory with one JSON file per record. It stands for
// any external system the agent writes to: what matters is that a created record gets an
// id of the system's choosing, and that records can be searched by the key they carry.
type Docs struct{ Dir string }

// Create stores d under a fresh id. The file appears whole (written, synced, then renamed)
// or not at all.
func (s Docs) Create(d Document) (Document, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return Document{}, err
	}
	d.ID = d.Kind + "-" + hex.EncodeToString(b)
	raw, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return Document{}, err
	}
	tmp, err := os.CreateTemp(s.Dir, ".new-*")
	if err != nil {
		return Document{}, fmt.Errorf("create %s: %w", d.Kind, err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	_, err = tmp.Write(raw)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(s.Dir, d.ID+".json"))
	}
	if err != nil {
		return Document{}, fmt.Errorf("create %s: %w", d.Kind, err)
	}
	return d, nil
}

// Get reads the record a receipt ("doc://<id>") or id names.
func (s Docs) Get(ref string) (Document, error) {
	id := ref
	if _, after, ok := strings.Cut(ref, "://"); ok {
		id = after
	}
	if id == "" || strings.ContainsAny(id, `/\`) || strings.HasPrefix(id, ".") {
		return Document{}, fmt.Errorf("get document: bad reference %q", ref)
	}
	raw, err := os.ReadFile(filepath.Join(s.Dir, id+".json"))
	if err != nil {
		return Document{}, fmt.Errorf("get document: %w", err)
	}
	var d Document
	if err := json.Unmarshal(raw, &d); err != nil {
		return Document{}, fmt.Errorf("get document %s: %w", id, err)
	}
	return d, nil
}

// Search returns the records created under an idempotency key, ordered by id.
func (s Docs) Search(key string) ([]Document, error) {
	return s.find(func(d Document) bool { return d.Key == key })
}

// SearchByRunID returns every record of a run, ordered by id.
func (s Docs) SearchByRunID(runID string) ([]Document, error) {
	return s.find(func(d Document) bool { return d.RunID == runID })
}

func (s Docs) find(match func(Document) bool) ([]Document, error) {
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil, fmt.Errorf("search documents: %w", err)
	}
	var out []Document
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") {
			continue
		}
		d, err := s.Get(strings.TrimSuffix(name, ".json"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if match(d) {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
