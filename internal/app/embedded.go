//go:build !noembed

package app

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// embeddedNATS runs the quickstart's NATS server inside the process: JetStream with file storage
// under dataDir. It opens no listening socket at all — the process talks to it in-process — so
// nothing outside the process can reach it.
type embeddedNATS struct {
	srv  *server.Server
	lock *os.File // data_dir's lock, held until stop
	// optDir is the store directory it was started with, store the one JetStream made in it
	// (its own jetstream subdirectory).
	optDir, store string
	// writeFailed: the server logged a store write failure since JetStream last started
	// (see watchStore).
	writeFailed atomic.Bool
}

// embeddedMaxStore is the embedded JetStream's store limit (see startEmbeddedNATS).
const embeddedMaxStore = 1 << 40

func startEmbeddedNATS(dataDir string) (*embeddedNATS, error) {
	storeDir, err := filepath.Abs(filepath.Join(dataDir, "jetstream"))
	if err != nil {
		return nil, fmt.Errorf("embedded nats: data_dir %q: %w", dataDir, err)
	}
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return nil, err
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
		JetStreamMaxStore: embeddedMaxStore,
	})
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	e := &embeddedNATS{srv: srv, lock: lock, optDir: storeDir}
	srv.SetLoggerV2(writeErrLogger{&e.writeFailed}, false, false, false)
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		lock.Close()
		return nil, fmt.Errorf("embedded nats: not ready after 30s (store %s)", storeDir)
	}
	e.store = srv.StoreDir()
	return e, nil
}

// lockDataDir takes an exclusive lock on data_dir (the file sluice.lock in it, holding the
// owner's pid), so that a second process started on the same directory refuses to start instead
// of opening the same JetStream store at once. The lock goes with the process: a crash leaves
// no stale lock behind.
func lockDataDir(dataDir string) (*os.File, error) {
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, fmt.Errorf("embedded nats: data_dir %q: %w", dataDir, err)
	}
	name := filepath.Join(dataDir, "sluice.lock")
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: data_dir %q: %w", dataDir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		owner, _ := os.ReadFile(name)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data_dir %q is in use by another Sluice process (pid %s): stop it, or give this one another data_dir",
				dataDir, strings.TrimSpace(string(owner)))
		}
		return nil, fmt.Errorf("embedded nats: locking data_dir %q: %w", dataDir, err)
	}
	if err := f.Truncate(0); err == nil {
		fmt.Fprintf(f, "%d\n", os.Getpid())
	}
	return f, nil
}

// connect returns an in-process client connection.
func (e *embeddedNATS) connect() (*nats.Conn, error) {
	return nats.Connect("", nats.InProcessServer(e.srv), nats.Name("sluice-ingress"))
}

// storeDir is where the server keeps its streams.
func (e *embeddedNATS) storeDir() string { return e.store }

// stop shuts the server down and waits until JetStream has flushed its store.
func (e *embeddedNATS) stop() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	e.lock.Close() // releases the lock
}
