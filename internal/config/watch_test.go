package config

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// watchBundle runs a Watcher over a file in a temporary directory and records what it
// reports.
type watchBundle struct {
	path    string
	w       *Watcher
	signals chan os.Signal // Signals of w; nil when it takes SIGHUP
	changes chan *Config
	errs    chan error
	checked chan struct{} // one value per debounced look at the file
}

const validConfig = "listen: 127.0.0.1:1111\n"

// startWatcher writes content to a new config file and runs a Watcher over it until the
// test ends. With sighup, the Watcher takes SIGHUP; else b.signals.
func startWatcher(t *testing.T, content string, sighup bool) *watchBundle {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	b := &watchBundle{
		path:    filepath.Join(t.TempDir(), "sluice.yaml"),
		changes: make(chan *Config, 16),
		errs:    make(chan error, 16),
		checked: make(chan struct{}, 16),
	}
	if !sighup {
		b.signals = make(chan os.Signal, 1)
	}
	writeFile(t, b.path, content)
	b.w = &Watcher{
		Path:     b.path,
		OnChange: func(c *Config) { b.changes <- c },
		OnError:  func(err error) { b.errs <- err },
		Signals:  b.signals,
		Debounce: 20 * time.Millisecond,
		Getenv:   noEnv,
		checked: func() {
			select {
			case b.checked <- struct{}{}:
			default:
			}
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	b.w.init()
	select {
	case <-b.w.ready:
	case err := <-done:
		t.Fatalf("Run returned before watching: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not start watching")
	}
	return b
}

// writeFile replaces path the way editors do: write a temporary file, rename it over.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func (b *watchBundle) nextChange(t *testing.T) *Config {
	t.Helper()
	select {
	case c := <-b.changes:
		return c
	case err := <-b.errs:
		t.Fatalf("got error %v, want a change", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no change within 5s")
	}
	return nil
}

// waitCheck waits for the watcher to look at the file after an event. Reports of that look
// are sent before it returns.
func (b *watchBundle) waitCheck(t *testing.T) {
	t.Helper()
	select {
	case <-b.checked:
	case <-time.After(5 * time.Second):
		t.Fatal("the watcher did not look at the file within 5s")
	}
}

func (b *watchBundle) nextError(t *testing.T) error {
	t.Helper()
	select {
	case err := <-b.errs:
		return err
	case c := <-b.changes:
		t.Fatalf("got change %+v, want an error", c)
	case <-time.After(5 * time.Second):
		t.Fatal("no error within 5s")
	}
	return nil
}

// noMore asserts that nothing is pending. Callbacks run one at a time on Run's goroutine, so
// once the reload that produced the last report has returned, any other report would be
// queued behind a signal's reload: that reload, of unchanged content, must be the next report.
func (b *watchBundle) noMoreThan(t *testing.T, want string) {
	t.Helper()
	b.signals <- syscall.SIGHUP
	c := b.nextChange(t)
	if c.Listen != want {
		t.Fatalf("after the reports expected, got a change to listen %q, want %q", c.Listen, want)
	}
}

func TestWatcherFileChange(t *testing.T) {
	b := startWatcher(t, validConfig, false)

	writeFile(t, b.path, "listen: 127.0.0.1:2222\n")
	if c := b.nextChange(t); c.Listen != "127.0.0.1:2222" || c.Path != b.path {
		t.Fatalf("change: listen %q path %q", c.Listen, c.Path)
	}

	// Writing in place (truncate, then write) is seen as well. Should the watcher look
	// between the two, it finds an empty file, which is an error, never an empty config.
	if err := os.WriteFile(b.path, []byte("listen: 127.0.0.1:3333\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case c := <-b.changes:
			if c.Listen != "127.0.0.1:3333" {
				t.Fatalf("change: listen %q", c.Listen)
			}
		case err := <-b.errs:
			if !strings.HasSuffix(err.Error(), ": file is empty") {
				t.Fatalf("in-place write: %v", err)
			}
			continue
		case <-time.After(5 * time.Second):
			t.Fatal("no change within 5s")
		}
		break
	}
	b.noMoreThan(t, "127.0.0.1:3333")
}

func TestWatcherInvalidKeepsOld(t *testing.T) {
	b := startWatcher(t, validConfig, false)

	writeFile(t, b.path, "listen: nowhere\nrules: [{name: r}]\n")
	err := b.nextError(t)
	var ce *Error
	if !errors.As(err, &ce) || len(ce.Problems) < 2 || !strings.Contains(err.Error(), b.path+`: listen: invalid address "nowhere"`) {
		t.Fatalf("error = %v", err)
	}
	// Events that leave the file as it was do not report again: write a neighbour.
	b.waitCheck(t) // the look that reported the error
	if err := os.WriteFile(filepath.Join(filepath.Dir(b.path), "other"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	b.waitCheck(t)
	select {
	case c := <-b.changes:
		t.Fatalf("unchanged file reported a change: %+v", c)
	case err := <-b.errs:
		t.Fatalf("unchanged file reported again: %v", err)
	default:
	}
	// The invalid file produced an error and no change; a valid one is loaded again.
	writeFile(t, b.path, "listen: 127.0.0.1:4444\n")
	if c := b.nextChange(t); c.Listen != "127.0.0.1:4444" {
		t.Fatalf("change: listen %q", c.Listen)
	}
	b.noMoreThan(t, "127.0.0.1:4444")
}

func TestWatcherSignals(t *testing.T) {
	b := startWatcher(t, validConfig, false)

	// A signal reloads even unchanged content.
	b.signals <- syscall.SIGHUP
	if c := b.nextChange(t); c.Listen != "127.0.0.1:1111" {
		t.Fatalf("signal: listen %q", c.Listen)
	}

	// A missing file is an error, and its return a change.
	if err := os.Remove(b.path); err != nil {
		t.Fatal(err)
	}
	if err := b.nextError(t); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	writeFile(t, b.path, validConfig)
	if c := b.nextChange(t); c.Listen != "127.0.0.1:1111" {
		t.Fatalf("file back: listen %q", c.Listen)
	}
}

func TestWatcherSIGHUP(t *testing.T) {
	b := startWatcher(t, validConfig, true)
	// Run registered for SIGHUP before it was ready, so the signal cannot kill the test.
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if c := b.nextChange(t); c.Listen != "127.0.0.1:1111" {
		t.Fatalf("SIGHUP: listen %q", c.Listen)
	}
}

func TestWatchMissingDirectory(t *testing.T) {
	defer goleak.VerifyNone(t)
	err := (&Watcher{Path: filepath.Join(t.TempDir(), "gone", "sluice.yaml")}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "config: watch") {
		t.Fatalf("Watch on a missing directory: %v", err)
	}
}

// A change written between the caller's Load and the start of Run is reloaded at once: the
// Watcher compares the file with what its Current config was parsed from. The same file
// unchanged reloads nothing.
func TestWatchCurrentCatchesEarlyChange(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, changed := range []bool{true, false} {
		path := filepath.Join(t.TempDir(), "sluice.yaml")
		writeFile(t, path, validConfig)
		cur, err := Parse(path, []byte(validConfig), noEnv)
		if err != nil {
			t.Fatal(err)
		}
		if changed {
			writeFile(t, path, "listen: 127.0.0.1:2222\n")
		}
		changes := make(chan *Config, 4)
		w := &Watcher{Path: path, Current: cur, Getenv: noEnv, Signals: make(chan os.Signal),
			OnChange: func(c *Config) { changes <- c }}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		w.init()
		<-w.ready // Run has compared the file with Current
		select {
		case c := <-changes:
			if !changed {
				t.Errorf("reloaded an unchanged file: %+v", c)
			} else if c.Listen != "127.0.0.1:2222" {
				t.Errorf("reloaded listen %q, want 127.0.0.1:2222", c.Listen)
			}
		default:
			if changed {
				t.Error("the change made before Run started was not reloaded")
			}
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
