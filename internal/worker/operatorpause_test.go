package worker

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// TestOperatorPauseAdmit: a job goes at once while the queue is not paused (or its pause has
// ended by itself); while it is paused the job waits, goes once the pause is lifted, and is
// not sent when the queue stops meanwhile.
func TestOperatorPauseAdmit(t *testing.T) {
	clock := newFakeClock()
	for _, c := range []struct {
		name     string
		controls []queue.Control // the control at each look, the last one from then on
		stopped  bool
		want     verdictKind
		looks    int
	}{
		{"not paused", []queue.Control{{}}, false, admitGo, 1},
		{"a pause that ended by itself", []queue.Control{{Paused: true, PausedUntil: clock.now().Add(-time.Second)}}, false, admitGo, 1},
		{"paused, then lifted", []queue.Control{{Paused: true}, {Paused: true}, {}}, false, admitGo, 3},
		{"paused while the queue stops", []queue.Control{{Paused: true}}, true, admitRefuse, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			looks := 0
			env := testEnv("q", func() *QueueConfig { return &QueueConfig{} })
			env.now = clock.now
			env.control = func() queue.Control {
				looks++
				return c.controls[min(looks, len(c.controls))-1]
			}
			ctx, cancel := context.WithCancel(context.Background())
			if c.stopped {
				cancel()
			}
			defer cancel()
			got := (&operatorPause{env: env}).admit(ctx, &QueueConfig{}, testJob("j", ""))
			if got.kind != c.want || looks != c.looks {
				t.Fatalf("admit = %+v after %d looks, want kind %d after %d", got, looks, c.want, c.looks)
			}
			if got.kind == admitRefuse && got.end != endNotSent {
				t.Fatalf("refused with end %d, want endNotSent", got.end)
			}
		})
	}
}
