//go:build !noembed

package app

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// embeddedNATS runs the quickstart's NATS server inside the process: JetStream with file storage
// under dataDir. It opens no listening socket at all — the process talks to it in-process — so
// nothing outside the process can reach it.
type embeddedNATS struct {
	srv *server.Server
}

func startEmbeddedNATS(dataDir string) (*embeddedNATS, error) {
	storeDir, err := filepath.Abs(filepath.Join(dataDir, "jetstream"))
	if err != nil {
		return nil, fmt.Errorf("embedded nats: data_dir %q: %w", dataDir, err)
	}
	srv, err := server.NewServer(&server.Options{
		ServerName: "sluice-embedded",
		DontListen: true,
		JetStream:  true,
		StoreDir:   storeDir,
		NoSigs:     true,
		NoLog:      true,
		// The queues' max_bytes are reserved against this when their streams are made, not
		// against the free disk (75% of it by default): a quickstart on a nearly full disk
		// still starts, and a disk that does fill is answered as any full NATS store is
		// (503 at once, named in /readyz).
		JetStreamMaxStore: 1 << 40,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded nats: not ready after 30s (store %s)", storeDir)
	}
	return &embeddedNATS{srv: srv}, nil
}

// connect returns an in-process client connection.
func (e *embeddedNATS) connect() (*nats.Conn, error) {
	return nats.Connect("", nats.InProcessServer(e.srv), nats.Name("sluice-ingress"))
}

// storeDir is where the server keeps its streams.
func (e *embeddedNATS) storeDir() string { return e.srv.StoreDir() }

// stop shuts the server down and waits until JetStream has flushed its store.
func (e *embeddedNATS) stop() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}
