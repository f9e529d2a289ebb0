// Command fakeprovider is a stand-in for an external API (a CRM) for the tutorial
// (docs/tutorial.md): it logs every request it receives, so you can see exactly what
// airlock sent and how often.
//
//	POST /notes   stores the note and answers 201 {"id": "note-N"}
//	POST /slow    stores the note, then answers only after --slow (default 5s): airlock's
//	              connector times out first, so the outcome is unknown (it did happen)
//	GET  /notes   lists what was received
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"sync"
	"time"
)

type note struct {
	ID             string          `json:"id"`
	Path           string          `json:"path"`
	IdempotencyKey string          `json:"idempotency_key"`
	Body           json.RawMessage `json:"body"`
}

func main() {
	listen := flag.String("listen", "127.0.0.1:9090", "address to listen on")
	slow := flag.Duration("slow", 5*time.Second, "how long POST /slow takes to answer")
	flag.Parse()
	var mu sync.Mutex
	var notes []note
	record := func(r *http.Request) note {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if !json.Valid(b) {
			b, _ = json.Marshal(string(b))
		}
		mu.Lock()
		defer mu.Unlock()
		n := note{ID: fmt.Sprintf("note-%d", len(notes)+1), Path: r.URL.Path, IdempotencyKey: r.Header.Get("Idempotency-Key"), Body: b}
		notes = append(notes, n)
		log.Printf("received %s on %s (Idempotency-Key %q): %s", n.ID, n.Path, n.IdempotencyKey, b)
		return n
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /notes", func(w http.ResponseWriter, r *http.Request) {
		n := record(r)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]string{"id": n.ID})
	})
	mux.HandleFunc("POST /slow", func(w http.ResponseWriter, r *http.Request) {
		n := record(r)
		select {
		case <-time.After(*slow):
		case <-r.Context().Done():
			log.Printf("%s: the caller gave up waiting (the note was stored all the same)", n.ID)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]string{"id": n.ID})
	})
	mux.HandleFunc("GET /notes", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(notes)
	})
	log.Printf("fake provider listening on http://%s", *listen)
	log.Fatal(http.ListenAndServe(*listen, mux))
}
