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

// Document is one document of the (file-backed) document system.
type Document struct {
	ID    string `json:"id"`
	RunID string `json:"run_id"`
	Title string `json:"title"`
	Body  string `json:"body"`
}

// Receipt is how the ledger refers to the document: checkable by anyone with access.
func (d Document) Receipt() string { return "doc://" + d.ID }

// Docs is the document system: a directory with one JSON file per document. It stands
// for any external system the agent writes to: what matters is that a created document
// gets an id of the system's choosing, and that documents can be searched by run id.
type Docs struct{ Dir string }

// Create stores a new document under a fresh id. The file appears whole (written, synced,
// then renamed) or not at all.
func (d Docs) Create(runID, title, body string) (Document, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return Document{}, err
	}
	doc := Document{ID: "doc-" + hex.EncodeToString(b), RunID: runID, Title: title, Body: body}
	raw, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return Document{}, err
	}
	tmp, err := os.CreateTemp(d.Dir, ".new-*")
	if err != nil {
		return Document{}, fmt.Errorf("create document: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := tmp.Write(raw); err != nil {
		tmp.Close()
		return Document{}, fmt.Errorf("create document: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return Document{}, fmt.Errorf("create document: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return Document{}, fmt.Errorf("create document: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(d.Dir, doc.ID+".json")); err != nil {
		return Document{}, fmt.Errorf("create document: %w", err)
	}
	return doc, nil
}

// Get reads the document a receipt ("doc://<id>") or id names.
func (d Docs) Get(ref string) (Document, error) {
	id := strings.TrimPrefix(ref, "doc://")
	if id == "" || strings.ContainsAny(id, `/\`) || strings.HasPrefix(id, ".") {
		return Document{}, fmt.Errorf("get document: bad reference %q", ref)
	}
	raw, err := os.ReadFile(filepath.Join(d.Dir, id+".json"))
	if err != nil {
		return Document{}, fmt.Errorf("get document: %w", err)
	}
	var doc Document
	if err := json.Unmarshal(raw, &doc); err != nil {
		return Document{}, fmt.Errorf("get document %s: %w", id, err)
	}
	return doc, nil
}

// SearchByRunID returns every document created for runID, ordered by id: the search an
// agent runs to reconcile an effect that was planned but never confirmed.
func (d Docs) SearchByRunID(runID string) ([]Document, error) {
	entries, err := os.ReadDir(d.Dir)
	if err != nil {
		return nil, fmt.Errorf("search documents: %w", err)
	}
	var out []Document
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") {
			continue
		}
		doc, err := d.Get(strings.TrimSuffix(name, ".json"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if doc.RunID == runID {
			out = append(out, doc)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
