package limit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// childEnv, when set, makes TestWeightedHitsAcrossProcesses the child side: the test binary
// re-executed as a second (and third) process, with its work described in the variable.
const childEnv = "SLUICE_LIMIT_CHILD"

// childWork is what one child process does: goroutines × tries requests of random costs
// 1..maxCost against one key of one Redis, starting when the parent says so.
type childWork struct {
	Addr     string
	Prefix   string
	Limit    Limit
	Refund   bool // adjust each admitted request to a true cost in 0..its cost
	MaxBatch int
	Seed     uint64
}

const (
	procGoroutines = 64
	procTries      = 20
	procMaxCost    = 10
	procLimit      = 1000
)

// TestWeightedHitsAcrossProcesses runs 2 OS processes × 64 goroutines against one Redis key,
// for each algorithm, each goroutine asking with random costs 1..10 under a limit of 1000 units
// that cannot refill during the test. The units admitted are at most 1000 and at least
// 1000 - 10 + 1: every request that fits is admitted, since 2 × 64 × 20 requests are more than
// 1000. With refunds (each admitted request reconciled to a true cost in 0..its cost, at once),
// the true units admitted never exceed 1000, while the estimates admitted do: refunds let more
// requests in, never more units.
func TestWeightedHitsAcrossProcesses(t *testing.T) {
	if spec := os.Getenv(childEnv); spec != "" {
		runChild(t, spec)
		return
	}
	srv := testenv.Redis(t)
	limits := []Limit{
		{Algorithm: TokenBucket, Limit: procLimit, Period: 1000 * time.Hour},
		{Algorithm: LeakyBucket, Limit: procLimit, Period: 1000 * time.Hour, Burst: procLimit},
		{Algorithm: GCRA, Limit: procLimit, Period: 1000 * time.Hour},
		{Algorithm: FixedWindow, Limit: procLimit, Period: 10000 * time.Hour},
		{Algorithm: SlidingLog, Limit: procLimit, Period: 1000 * time.Hour},
		{Algorithm: SlidingWindow, Limit: procLimit, Period: 1000 * time.Hour},
	}
	for _, refund := range []bool{false, true} {
		for _, l := range limits {
			name := string(l.Algorithm)
			if refund {
				name += "/refunds"
			}
			t.Run(name, func(t *testing.T) {
				charged, used := runChildren(t, srv, l, refund)
				switch {
				case !refund && (charged > procLimit || charged <= procLimit-procMaxCost):
					t.Errorf("admitted %d units, want in (%d, %d]", charged, procLimit-procMaxCost, procLimit)
				case refund && used > procLimit:
					t.Errorf("admitted %d true units, more than the limit %d", used, procLimit)
				case refund && charged <= procLimit:
					t.Errorf("admitted %d units of estimates with refunds, want more than %d", charged, procLimit)
				}
				t.Logf("admitted %d units charged, %d used", charged, used)
			})
		}
	}
}

// runChildren starts two children on l, lets them go at once, and returns the units they
// were admitted: charged (estimates) and used (true costs).
func runChildren(t *testing.T, srv *testenv.RedisServer, l Limit, refund bool) (charged, used int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := testenv.Prefix(t)
	type child struct {
		cmd *exec.Cmd
		out bytes.Buffer
	}
	children := make([]*child, 2)
	for i := range children {
		w := childWork{Addr: srv.Addr, Prefix: prefix, Limit: l, Refund: refund, MaxBatch: []int{0, -1}[i], Seed: uint64(i)}
		spec, err := json.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		c := &child{cmd: exec.CommandContext(ctx, os.Args[0], "-test.run=^TestWeightedHitsAcrossProcesses$")}
		c.cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
		c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children[i] = c
	}
	// Both children are connected and waiting: start them together.
	for range children {
		if err := srv.Client.BLPop(ctx, time.Minute, prefix+"ready").Err(); err != nil {
			t.Fatalf("waiting for the children: %v", err)
		}
	}
	if err := srv.Client.RPush(ctx, prefix+"go", 1, 1).Err(); err != nil {
		t.Fatal(err)
	}
	for i, c := range children {
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, c.out.String())
		}
		found := false
		sc := bufio.NewScanner(&c.out)
		for sc.Scan() {
			var ch, us int64
			if _, err := fmt.Sscanf(sc.Text(), "admitted %d %d", &ch, &us); err == nil {
				charged, used, found = charged+ch, used+us, true
			}
		}
		if !found {
			t.Fatalf("child %d reported nothing:\n%s", i, c.out.String())
		}
	}
	return charged, used
}

// runChild is the child side: it does the work of spec and prints the units admitted.
func runChild(t *testing.T, spec string) {
	var w childWork
	if err := json.Unmarshal([]byte(spec), &w); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: w.Addr, PoolSize: procGoroutines})
	defer rdb.Close()
	lim := NewRedis(rdb, RedisConfig{Prefix: w.Prefix, MaxBatch: w.MaxBatch})
	if err := rdb.RPush(ctx, w.Prefix+"ready", 1).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.BLPop(ctx, time.Minute, w.Prefix+"go").Err(); err != nil {
		t.Fatal(err)
	}
	var charged, used atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, procGoroutines)
	for g := range procGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(w.Seed, uint64(g)))
			for range procTries {
				cost := 1 + rng.Int64N(procMaxCost)
				d, err := lim.Decide(ctx, "hot", w.Limit, cost)
				if err != nil {
					errs <- err
					return
				}
				if !d.Allowed {
					continue
				}
				charged.Add(cost)
				u := cost
				if w.Refund {
					u = rng.Int64N(cost + 1)
					if err := lim.Adjust(ctx, "hot", w.Limit, d, u); err != nil {
						errs <- err
						return
					}
				}
				used.Add(u)
			}
		}()
	}
	wg.Wait()
	close(errs)
	var msgs []string
	for err := range errs {
		msgs = append(msgs, err.Error())
	}
	if len(msgs) > 0 {
		t.Fatal(strings.Join(msgs, "\n"))
	}
	fmt.Printf("admitted %d %d\n", charged.Load(), used.Load())
}
