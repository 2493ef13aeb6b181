package limit

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Several decisions in one script run.
//
// A DecideAll's requests whose keys share a group of state (the store on a single Redis, one
// hash slot on a Redis Cluster: the group of the epoch key, see reset.go) are decided by one
// run of lua/multi.lua instead of one script each: one EVALSHA, one TIME, one epoch check,
// then each request's algorithm in order, the same code its own script runs. Each decision is
// what its own script would have made at that instant (later requests of a key see the
// earlier ones' charges, as in a pipeline of single scripts), and the run is atomic as a
// whole. What it saves is Redis's fixed cost per script (the call, its KEYS and ARGV, the
// reply; about 10 µs of a 15–18 µs decision, BENCHMARKS.md) and the store's per-command work,
// paid once per group instead of once per request.
//
// On a Redis Cluster each key has its own hash tag, so requests rarely share a slot: they
// are decided by a run each as before, and only those of one slot share a run. A client that
// is neither a *redis.Client nor a *redis.ClusterClient (a *redis.Ring shards keys itself)
// gets a script per request.

// multiSource is lua/multi.lua with each algorithm's file as a function (and the token
// bucket's record of levels, lua/peaks.lua); multiSHA its hash
// as an EVALSHA argument.
var (
	multiSource = func() string {
		var algs strings.Builder
		for a, name := range algoFiles {
			fmt.Fprintf(&algs, "algs[%d] = function(KEYS, ARGV)\n%s\nend\n", a, mustRead("lua/"+name+".lua"))
		}
		const marker = "-- ALGORITHMS"
		m := mustRead("lua/multi.lua")
		i := strings.Index(m, marker)
		if i < 0 {
			panic("limit: lua/multi.lua has no " + marker + " line") // embedded: cannot happen
		}
		j := i + strings.IndexByte(m[i:], '\n') + 1
		return mustRead("lua/lib.lua") + mustRead("lua/peaks.lua") + mustRead("lua/epoch.lua") + m[:j] + algs.String() + m[j:]
	}()
	multiSHA any = redis.NewScript(multiSource).Hash()
)

// grouping is how a store groups keys for multi.lua.
type grouping uint8

const (
	groupNone  grouping = iota // a script per request
	groupOne                   // every key in one group: a single Redis
	groupSlots                 // by hash slot: a Redis Cluster
)

func groupingOf(rdb RedisClient) grouping {
	switch rdb.(type) {
	case *redis.Client:
		return groupOne
	case *redis.ClusterClient:
		return groupSlots
	}
	return groupNone
}

// A run is one script run of a DecideAll: cmd decides the requests at reqs, by multi.lua
// when there are several, else by the request's own script.
type run struct {
	cmd   *redis.Cmd
	reqs  []int
	group int
	known int64 // the epoch the run was sent with
}

// runs returns the script runs that decide reqs (of params ps) at now: one per group of
// keys, or one per request when the store does not group them.
func (r *Redis) runs(reqs []Request, ps []params, now string) []run {
	var out []run
	if r.grouping == groupOne {
		all := make([]int, len(reqs))
		for i := range all {
			all[i] = i
		}
		out = []run{{reqs: all}}
	} else {
		out = make([]run, 0, len(reqs))
		for i, q := range reqs {
			g := -1
			if r.grouping == groupSlots {
				g = hashSlot(r.key(q.Key, ps[i].alg))
			}
			j := -1
			for k := range out {
				if g >= 0 && out[k].group == g {
					j = k
					break
				}
			}
			if j < 0 {
				out = append(out, run{group: g})
				j = len(out) - 1
			}
			out[j].reqs = append(out[j].reqs, i)
		}
	}
	for k := range out {
		u := &out[k]
		if len(u.reqs) == 1 {
			i := u.reqs[0]
			u.cmd = r.evalSha(reqs[i].Key, reqs[i].Limit, ps[i], reqs[i].Cost, now)
			continue
		}
		u.cmd, u.group, u.known = r.multiCmd(reqs, ps, u.reqs, now)
	}
	return out
}

// multiCmd returns the EVALSHA of multi.lua for the requests at idx, which share a group, and
// that group and the epoch known of it.
func (r *Redis) multiCmd(reqs []Request, ps []params, idx []int, now string) (*redis.Cmd, int, int64) {
	n := len(idx)
	args := make([]any, 0, 4+n+3+7*n)
	args = append(args, "evalsha", multiSHA, 1+n, nil)
	for _, i := range idx {
		args = append(args, r.key(reqs[i].Key, ps[i].alg))
	}
	g, ek, known := r.epochs.group(args[4].(string))
	args[3] = ek
	args = append(args, now, known, r.epochs.flag)
	for _, i := range idx {
		p := &ps[i]
		args = append(args, int64(p.alg), resetHold(reqs[i].Limit, *p))
		switch p.alg {
		case algTokenBucket:
			args = append(args, p.unit, p.refill, p.cap, reqs[i].Cost, recArg(*p))
		case algLeakyBucket, algGCRA:
			args = append(args, p.unit, p.refill, p.cap, reqs[i].Cost)
		default:
			args = append(args, p.period, p.limit, reqs[i].Cost)
		}
	}
	return redis.NewCmd(context.Background(), args...), g, known
}

// decisions reads the replies of runs, whose commands are now cmds (a command may have been
// replaced by its EVAL), as the decisions of reqs.
func (r *Redis) decisions(reqs []Request, ps []params, runs []run, cmds []*redis.Cmd) ([]Decision, error) {
	out := make([]Decision, len(reqs))
	for k := range runs {
		u, cmd := &runs[k], cmds[k]
		if len(u.reqs) == 1 {
			i := u.reqs[0]
			d, err := r.decision(reqs[i].Key, ps[i], reqs[i].Cost, cmd)
			if err != nil {
				return nil, fmt.Errorf("limit: decide request %d %.64q: %w", i, reqs[i].Key, err)
			}
			out[i] = d
			continue
		}
		v, err := cmd.Int64Slice()
		if err == nil && len(v) != 5*len(u.reqs)+1 {
			err = fmt.Errorf("limit: script returned %d values, want %d", len(v), 5*len(u.reqs)+1)
		}
		if err != nil {
			i := u.reqs[0]
			return nil, fmt.Errorf("limit: decide requests %d %.64q and %d more in one run: %w", i, reqs[i].Key, len(u.reqs)-1, err)
		}
		r.epochs.saw(u.group, u.known, v[len(v)-1], reqs[u.reqs[0]].Key)
		for j, i := range u.reqs {
			out[i] = decisionOf(ps[i], reqs[i].Cost, v[5*j:5*j+5])
		}
	}
	return out, nil
}

// pipeline runs cmds in one pipeline on r's client, and those the server did not know the
// script of again with EVAL (cmds then holds the EVALs).
func (r *Redis) pipeline(ctx context.Context, cmds []*redis.Cmd) {
	pipe := r.rdb.Pipeline()
	for _, c := range cmds {
		_ = pipe.Process(ctx, c)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	var again redis.Pipeliner
	for i, c := range cmds {
		if noScript(c.Err()) {
			if again == nil {
				again = r.rdb.Pipeline()
			}
			cmds[i] = evalCmd(c)
			_ = again.Process(ctx, cmds[i])
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
}
