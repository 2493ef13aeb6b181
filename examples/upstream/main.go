// Command upstream serves the quickstart's demo API on its own, for the multi-process deployment.
package main

import (
	"flag"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/sluice-rl/sluice/internal/demo"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to serve the demo API on")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	srv := &http.Server{Addr: *listen, Handler: demo.Handler(log), ReadHeaderTimeout: 5 * time.Second}
	log.Info("demo upstream listening", "addr", *listen)
	if err := srv.ListenAndServe(); err != nil {
		log.Error("demo upstream", "err", err)
		os.Exit(1)
	}
}
