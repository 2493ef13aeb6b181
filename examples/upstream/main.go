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
	ok := flag.Bool("ok", false, "answer every request with a plain 200 \"ok\" instead (the benchmarks' reference server)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	h := demo.Handler(log)
	if *ok {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	}
	srv := &http.Server{Addr: *listen, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Info("demo upstream listening", "addr", *listen)
	if err := srv.ListenAndServe(); err != nil {
		log.Error("demo upstream", "err", err)
		os.Exit(1)
	}
}
