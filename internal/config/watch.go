package config

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long a Watcher waits for a burst of file events to end.
const DefaultDebounce = 100 * time.Millisecond

// Watcher reloads a config file when told to and when it changes on disk, and hands each
// valid new Config to OnChange. An invalid file is reported to OnError instead; the caller
// keeps the config it has.
//
// It reloads on SIGHUP (or whatever Signals delivers) and when the file's content changes. It watches the file's directory, not the file: editors that save by
// writing a new file and renaming it over the old one, and Kubernetes ConfigMap volumes that
// swap a symlink, are seen too. File events are debounced, and a file whose content is the
// same as at the last load (or, before the first, as when Run started) is not reloaded;
// Signals always reload.
//
// Fill in the fields, then call Run once. The zero value of each optional field is its
// default.
type Watcher struct {
	// Path is the config file. Required.
	Path string
	// OnChange receives each valid config loaded. Optional.
	OnChange func(*Config)
	// OnError receives why a reload failed: an *Error for an invalid file, or the error of
	// reading it or of watching its directory. Optional.
	OnError func(error)
	// Signals triggers a reload on each value received. Nil: SIGHUP, through signal.Notify
	// for the time Run runs.
	Signals <-chan os.Signal
	// Debounce is how long file events must be quiet before the file is read; the read
	// happens at the latest 10×Debounce after the first event. Default DefaultDebounce.
	Debounce time.Duration
	// Getenv looks up the environment overrides (see Parse). Default os.Getenv.
	Getenv func(string) string
	// Current is the config the caller runs with, as Load returned it. Run reloads at once
	// when the file no longer holds what Current was parsed from, so that a change made
	// between the caller's Load and Run's start is not missed. Nil: the file as Run finds it
	// is taken to be current.
	Current *Config

	once      sync.Once
	readyOnce sync.Once
	ready     chan struct{} // closed once Run watches, for tests
	checked   func()        // called after each debounced look at the file, for tests
}

func (w *Watcher) init() {
	w.once.Do(func() {
		w.ready = make(chan struct{})
	})
}

// Run watches until ctx is done, then returns nil. OnChange and OnError are called from
// Run's goroutine, one at a time. Run returns an error only if it cannot start watching the
// file's directory.
func (w *Watcher) Run(ctx context.Context) error {
	w.init()
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("config: watch %s: %w", w.Path, err)
	}
	defer fw.Close()
	dir := filepath.Dir(w.Path)
	if err := fw.Add(dir); err != nil {
		return fmt.Errorf("config: watch %s: %w", dir, err)
	}
	signals, stopSignals := w.signals()
	defer stopSignals()
	l := w.newLoader()
	d := newDebouncer(w.Debounce)
	defer d.timer.Stop()

	// The directory is watched from here on; a change made before is found by comparing.
	l.load(false)
	w.readyOnce.Do(func() { close(w.ready) })
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-signals:
			l.load(true)
		case ev, ok := <-fw.Events:
			if !ok {
				return nil
			}
			if ev.Op != fsnotify.Chmod {
				d.event(time.Now())
			}
		case err, ok := <-fw.Errors:
			if !ok {
				return nil
			}
			w.fail(fmt.Errorf("config: watch %s: %w", dir, err))
		case <-d.timer.C:
			d.fired()
			l.load(false)
			if w.checked != nil {
				w.checked()
			}
		}
	}
}

// signals returns the channel of signals that trigger a reload, and what stops it.
func (w *Watcher) signals() (<-chan os.Signal, func()) {
	if w.Signals != nil {
		return w.Signals, func() {}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	return ch, func() { signal.Stop(ch) }
}

// loader reads and parses the file for Run, and hands the result on.
type loader struct {
	w      *Watcher
	getenv func(string) string
	last   []byte // the content of the last load; nil when the file could not be read
}

func (w *Watcher) newLoader() *loader {
	l := &loader{w: w, getenv: w.Getenv}
	if l.getenv == nil {
		l.getenv = os.Getenv
	}
	if w.Current != nil && w.Current.source != nil {
		l.last = w.Current.source
	} else {
		l.last, _ = os.ReadFile(w.Path)
	}
	return l
}

// load reads the file and hands it to OnChange, or its problem to OnError; unless always, a
// file whose content is that of the last load is left alone.
func (l *loader) load(always bool) {
	data, err := os.ReadFile(l.w.Path)
	if err != nil {
		l.last = nil
		l.w.fail(fmt.Errorf("config: %w", err))
		return
	}
	if !always && l.last != nil && bytes.Equal(data, l.last) {
		return
	}
	l.last = data
	cfg, err := Parse(l.w.Path, data, l.getenv)
	if err != nil {
		l.w.fail(err)
		return
	}
	if l.w.OnChange != nil {
		l.w.OnChange(cfg)
	}
}

// debouncer turns a burst of file events into one look at the file: its timer fires once the
// events have been quiet for wait, and at the latest 10×wait after the burst's first event.
type debouncer struct {
	wait  time.Duration
	timer *time.Timer
	first time.Time // of the pending burst; zero when none is pending
}

func newDebouncer(wait time.Duration) *debouncer {
	if wait <= 0 {
		wait = DefaultDebounce
	}
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &debouncer{wait: wait, timer: t}
}

// event notes a file event at now.
func (d *debouncer) event(now time.Time) {
	if d.first.IsZero() {
		d.first = now
	}
	d.timer.Reset(max(min(d.wait, d.first.Add(10*d.wait).Sub(now)), 0))
}

// fired notes that the timer fired: the burst is over.
func (d *debouncer) fired() { d.first = time.Time{} }

func (w *Watcher) fail(err error) {
	if w.OnError != nil {
		w.OnError(err)
	}
}
