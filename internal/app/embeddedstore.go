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

// Recovering the embedded JetStream from a full disk. A stream (or bucket) whose store failed
// to write ("no space left on device") keeps that error in nats-server until JetStream starts
// again: its publishes go unanswered and the acks of its jobs leave their messages in it, even
// after space is freed. A nats-server outside the process must be restarted (or reloaded with
// JetStream disabled, then enabled); the embedded one is restarted in place by watchStore:
// once a write failed and the store's filesystem has room again (storeRoom), JetStream is
// disabled and enabled again, which reopens every stream from its files, jobs and consumers
// included, in milliseconds, without closing the process's connection. The queues then answer
// again, and the leftovers are removed (leftovers.go), once the process's connection has
// reconnected (as after a restart of nats-server).

const (
	// storeRoomBytes and storeRoomShare: the store's filesystem has room again when it has
	// storeRoomBytes free, or storeRoomShare of its size on a smaller one.
	storeRoomBytes = 64 << 20
	storeRoomShare = 0.10
	// storeRestartMax bounds the doubling wait between two restarts of JetStream whose
	// writes keep failing.
	storeRestartMax = time.Minute
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

// watchStore restarts JetStream in place after a store write failure, once the store's
// filesystem has room again, checking every second until ctx ends; restarts whose writes
// fail again are spaced 1 s, 2 s, 4 s... apart, up to storeRestartMax. After each restart it
// calls restarted: the process reconnects its connection, so that what waits on JetStream
// (a worker's long pull, whose request the old JetStream took along) starts afresh, as after
// a restart of nats-server.
func (e *embeddedNATS) watchStore(ctx context.Context, log *slog.Logger, restarted func()) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	wait, next, told := time.Second, time.Time{}, false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if !e.writeFailed.Load() || time.Now().Before(next) {
			continue
		}
		room, free, err := storeRoom(e.storeDir())
		if err != nil || !room {
			if !told {
				log.Error("ingress: the embedded JetStream could not write its store (no space left on device?); free space under data_dir: it starts again by itself once there is room",
					"store", e.storeDir(), "free_bytes", free, "err", err)
				told = true
			}
			continue
		}
		t0 := time.Now()
		e.writeFailed.Store(false)
		if err := e.restartJetStream(); err != nil {
			log.Error("ingress: restart the embedded JetStream", "err", err)
			e.writeFailed.Store(true)
		} else {
			log.Warn("ingress: restarted the embedded JetStream after its store failed to write; it writes again",
				"store", e.storeDir(), "free_bytes", free, "took", time.Since(t0).Round(time.Millisecond))
			restarted()
		}
		told, next, wait = false, time.Now().Add(wait), min(2*wait, storeRestartMax)
	}
}

// restartJetStream disables JetStream and enables it again with the options it started with
// (what a config reload turning it off, then on, does): every stream is reopened from its
// files, without the write error it kept.
func (e *embeddedNATS) restartJetStream() error {
	if err := e.srv.DisableJetStream(); err != nil {
		return err
	}
	return e.srv.EnableJetStream(&server.JetStreamConfig{StoreDir: e.optDir, MaxStore: embeddedMaxStore, Strict: true})
}
