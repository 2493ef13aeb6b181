// Package demo is the tiny upstream API of the quickstart: something for Sluice to protect. It
// answers every request with 200 and a small JSON body, and logs the orders it receives so the
// quickstart shows deferred jobs arriving at the queue's rate.
package demo

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"
)

// Handler returns the demo upstream. It is safe for concurrent use.
func Handler(log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	var orders atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/orders", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		n := orders.Add(1)
		log.Info("demo upstream: order received", "n", n,
			"idempotency_key", r.Header.Get("Idempotency-Key"),
			"attempt", r.Header.Get("Sluice-Attempt"), "bytes", len(body))
		writeJSON(w, http.StatusOK, map[string]any{"order": n, "received_at": time.Now().UTC()})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "method": r.Method, "path": r.URL.Path})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
