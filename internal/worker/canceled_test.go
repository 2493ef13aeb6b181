package worker

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestUncanceledAdmit: a job an operator canceled is not sent; any other goes.
func TestUncanceledAdmit(t *testing.T) {
	var canceled sync.Map
	canceled.Store("gone", time.Now())
	u := &uncanceled{env: testEnv("q", func() *QueueConfig { return &QueueConfig{} }), canceled: &canceled}
	for _, c := range []struct {
		id   string
		want verdictKind
	}{{"gone", admitRefuse}, {"kept", admitGo}} {
		got := u.admit(context.Background(), &QueueConfig{}, testJob(c.id, ""))
		if got.kind != c.want || c.want == admitRefuse && got.end != endCanceled {
			t.Errorf("%s: admit = %+v, want kind %d (refused: endCanceled)", c.id, got, c.want)
		}
	}
}
