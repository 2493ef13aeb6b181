package app

import (
	"log/slog"

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
