package fair

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// backlog returns a stream like a fair queue's backlogs, with direct gets, and jobs of tenants
// a and b stored alternately: a-0 b-0 a-1 b-1 ...
func backlog(t testing.TB, perTenant int) (context.Context, jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	js, err := jetstream.New(testenv.Connect(t, testenv.NATS(t).URL))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.*"}, AllowDirect: true,
		Retention: jetstream.WorkQueuePolicy})
	if err != nil {
		t.Fatal(err)
	}
	for i := range perTenant {
		for _, tn := range []string{"a", "b"} {
			if _, err := js.Publish(ctx, "t."+tn, fmt.Appendf(nil, "%s-%d", tn, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return ctx, js, st
}

// A batch is the subject's next n messages at or after from, in order, with their sequences
// and storage times; fewer when there are fewer; none, without an error, when there are none.
func TestDirectGetBatch(t *testing.T) {
	ctx, js, _ := backlog(t, 5)
	g := newDirectGet(js, "T")
	for _, c := range []struct {
		subj string
		from uint64
		n    int
		want []string
	}{
		{"t.a", 0, 3, []string{"a-0", "a-1", "a-2"}},
		{"t.b", 0, 2, []string{"b-0", "b-1"}},
		{"t.a", 4, 2, []string{"a-2", "a-3"}}, // sequence 4 is b-1: the next of a is at 5
		{"t.a", 9, 10, []string{"a-4"}},
		{"t.a", 11, 3, nil},
		{"t.c", 0, 3, nil},
	} {
		got, err := g.batch(ctx, c.subj, c.from, c.n)
		if err != nil {
			t.Fatalf("batch(%s, %d, %d): %v", c.subj, c.from, c.n, err)
		}
		var bodies []string
		for i, m := range got {
			bodies = append(bodies, string(m.Data))
			if m.Sequence < c.from || i > 0 && m.Sequence <= got[i-1].Sequence || m.Time.IsZero() || m.Subject != c.subj {
				t.Errorf("batch(%s, %d, %d)[%d]: seq %d, time %v, subject %s", c.subj, c.from, c.n, i, m.Sequence, m.Time, m.Subject)
			}
		}
		if fmt.Sprint(bodies) != fmt.Sprint(c.want) {
			t.Errorf("batch(%s, %d, %d) = %v, want %v", c.subj, c.from, c.n, bodies, c.want)
		}
	}
}

// What the batched direct get buys over nats.go's Stream.GetMsg, one request per job, for a
// tenant's share of a round:
//
//	go test -run '^$' -bench GetBatch ./queue/fair/
func BenchmarkGetBatch(b *testing.B) {
	const n = 32
	ctx, js, st := backlog(b, n)
	b.Run("batch", func(b *testing.B) {
		g := newDirectGet(js, "T")
		b.ReportAllocs()
		for b.Loop() {
			if got, err := g.batch(ctx, "t.a", 0, n); err != nil || len(got) != n {
				b.Fatal(len(got), err)
			}
		}
	})
	b.Run("GetMsg", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			seq := uint64(0)
			for range n {
				m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject("t.a"))
				if err != nil {
					b.Fatal(err)
				}
				seq = m.Sequence + 1
			}
		}
	})
}
