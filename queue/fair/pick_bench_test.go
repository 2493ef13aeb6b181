package fair

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkPick is the picker's cost per job moved, by jobs and by units, with 10 and 10 000
// tenants whose jobs cost 10 to 70 units: a pick of up to 32 jobs and 1 280 units, then the
// charge of their true costs, as a round does. ns/job is the figure; the NATS round trips of a
// move come on top (BenchmarkMove).
func BenchmarkPick(b *testing.B) {
	for _, tenants := range []int{10, 10_000} {
		for _, byUnits := range []bool{false, true} {
			mode := "jobs"
			if byUnits {
				mode = "units"
			}
			b.Run(fmt.Sprintf("by=%s/tenants=%d", mode, tenants), func(b *testing.B) {
				depths := make(map[string]uint64, tenants)
				cost := make(map[string]int64, tenants)
				for i := range tenants {
					id := fmt.Sprintf("t%05d", i)
					depths[id], cost[id] = 1<<40, int64(i%7+1)*10
				}
				var p picker
				p.setByUnits(byUnits)
				p.update(depths, nil)
				now := time.Unix(0, 0)
				costs := make([]int64, 0, 32)
				jobs := 0
				b.ReportAllocs()
				for b.Loop() {
					for _, pn := range p.pick(budget{jobs: 32, units: 32 * 40}, 0, now) {
						costs = costs[:0]
						for range pn.n {
							costs = append(costs, cost[pn.tenant])
						}
						p.charge(pn.tenant, pn.units, costs)
						jobs += pn.n
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(jobs, 1)), "ns/job")
			})
		}
	}
}
