package leaky

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// benchUnits is a unit budget as fast as benchRate, so that takes stay near "now".
var benchUnits = Units{N: 1_000_000, Per: time.Second}

// BenchmarkUnits compares, from one run, a take without cost, a take with cost, a take on two
// named budgets (TakeCosts) and a reconciliation (a refund of half the charge), in memory and in Redis (one connection at a
// time: the round trip, not the server's throughput).
//
//	go test -run '^$' -bench Units ./leaky/
func BenchmarkUnits(b *testing.B) {
	srv := testenv.Redis(b)
	for _, d := range []struct {
		name string
		s    CostSchedule
	}{
		{"memory", NewMemory(nil)},
		{"redis", NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(b)})},
	} {
		ctx := context.Background()
		b.Run(d.name+"/take", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := d.s.Take(ctx, "plain", benchRate); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(d.name+"/take-cost", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := d.s.TakeCost(ctx, "cost", benchRate, Ask{Units: benchUnits, Cost: 2}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(d.name+"/take-costs-2", func(b *testing.B) {
			bs := d.s.(BudgetSchedule)
			asks := []Ask{{Units: benchUnits, Cost: 2, Budget: "input"}, {Units: benchUnits, Cost: 1, Budget: "output"}}
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := bs.TakeCosts(ctx, "costs", benchRate, asks); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(d.name+"/reconcile", func(b *testing.B) {
			_, c, err := d.s.TakeCost(ctx, "reconcile", benchRate, Ask{Units: benchUnits, Cost: 2})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := d.s.Reconcile(ctx, "reconcile", c, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
