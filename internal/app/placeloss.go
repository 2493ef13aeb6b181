package app

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// placeLosses counts, in sluice_place_store_resets_total, and logs the losses of concurrency
// places that this process's Redis place stores learn of (inflight.WithOnLoss): a restart of
// Redis without persistence, a failover that lost them, a FLUSHALL. Each is counted and logged
// once per group of caps (a queue, or a rule's key) and process. The returned function is safe
// for concurrent use; the counter is registered in reg.
func placeLosses(reg prometheus.Registerer, log *slog.Logger, who string) func(key string) {
	c := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_place_store_resets_total",
		Help: "Losses of the concurrency places held in Redis (a restart without persistence, a failover, a FLUSHALL) " +
			"this process learned of, once per group of caps (a queue); no place of the group is granted for a while after each.",
	})
	reg.MustRegister(c)
	return func(key string) {
		c.Inc()
		log.Warn(who+": Redis lost the concurrency places (a restart without persistence, a failover or a FLUSHALL); "+
			"no place is granted until those taken before are out of use, and this process re-asserts the ones it holds",
			"key", key)
	}
}

// ruleLosses counts, in sluice_limit_store_resets_total, the losses of the rule state in Redis
// that this process's limiter learns of (limit.RedisConfig.OnLoss): once per loss on a single
// Redis, once per hash slot on a Redis Cluster. It logs the first, and then at most one line a
// minute, so that a cluster's slots learned one by one make one line. The returned function is
// safe for concurrent use; the counter is registered in reg.
func ruleLosses(reg prometheus.Registerer, log *slog.Logger) func(key string) {
	c := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_limit_store_resets_total",
		Help: "Losses of the rules' limiter state in Redis (a restart without persistence, a failover, a FLUSHALL) this process " +
			"learned of, once per Redis (per hash slot on a Redis Cluster); rules follow on_store_reset after each.",
	})
	reg.MustRegister(c)
	var mu sync.Mutex
	var last time.Time
	return func(key string) {
		c.Inc()
		mu.Lock()
		now := time.Now()
		quiet := !last.IsZero() && now.Sub(last) < time.Minute
		if !quiet {
			last = now
		}
		mu.Unlock()
		if !quiet {
			log.Warn("ingress: Redis lost the rules' limiter state (a restart without persistence, a failover or a FLUSHALL); "+
				"rules with on_store_reset: hold refuse requests until their limit would be whole again, the others start "+
				"afresh; debts of cost_from_response recorded before are forgotten (docs/store-reset.md)", "key", key)
		}
	}
}
