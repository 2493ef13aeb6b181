//go:build !noembed

package app

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// The embedded JetStream on a full disk. A stream (or bucket) whose store failed to write ("no
// space left on device") keeps that error in nats-server until JetStream starts again: its
// publishes go unanswered and the acks of its jobs leave their messages in it, even after space
// is freed. JetStream can be disabled and enabled again in place, but nats-server 2.15 does so
// with a data race against requests in flight (enableJetStream rewrites the server's export
// subscriptions while apiDispatch reads them), so the embedded server is not restarted in
// place: watchStore tells the operator, once when a write failed and once when the store has
// room again, that the ingress must be restarted (which restarts the embedded server; its
// streams reopen from their files, jobs and consumers included).

const (
	// storeRoomBytes and storeRoomShare: the store's filesystem has room again when it has
	// storeRoomBytes free, or storeRoomShare of its size on a smaller one.
	storeRoomBytes = 64 << 20
	storeRoomShare = 0.10
)

// writeErrLogger is the embedded server's logger: it notes a store write failure in failed
// and drops every line (the process logs what it does about it).
type writeErrLogger struct{ failed *atomic.Bool }

func (l writeErrLogger) Errorf(format string, v ...any) {
	if strings.Contains(strings.ToLower(fmt.Sprintf(format, v...)), "critical write error") {
		l.failed.Store(true)
	}
}
func (writeErrLogger) Noticef(string, ...any) {}
func (writeErrLogger) Warnf(string, ...any)   {}
func (writeErrLogger) Fatalf(string, ...any)  {}
func (writeErrLogger) Debugf(string, ...any)  {}
func (writeErrLogger) Tracef(string, ...any)  {}

var _ server.Logger = writeErrLogger{}

// storeRoom reports whether the filesystem of dir has room again (see storeRoomBytes), with
// its free bytes.
func storeRoom(dir string) (bool, uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return false, 0, err
	}
	free, size := st.Bavail*uint64(st.Bsize), st.Blocks*uint64(st.Bsize)
	return free >= min(storeRoomBytes, uint64(float64(size)*storeRoomShare)), free, nil
}

// watchStore checks every second, until ctx ends, whether the embedded store failed to write,
// and logs it once, and once more when its filesystem has room again (storeRoom): the ingress
// must then be restarted for the queues to write again.
func (e *embeddedNATS) watchStore(ctx context.Context, log *slog.Logger) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	told, toldRoom := false, false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if !e.writeFailed.Load() {
			continue
		}
		room, free, err := storeRoom(e.storeDir())
		switch {
		case !told:
			log.Error("ingress: the embedded JetStream could not write its store (no space left on device?); free space under data_dir, then restart the ingress",
				"store", e.storeDir(), "free_bytes", free, "err", err)
			told = true
		case room && !toldRoom:
			log.Error("ingress: the embedded store has room again; restart the ingress: its JetStream keeps the write error until it starts again",
				"store", e.storeDir(), "free_bytes", free)
			toldRoom = true
		}
	}
}
