// Package app assembles Sluice's two processes from their parts; cmd/ingress and cmd/worker are
// thin mains over [Ingress.Run] and [Worker.Run].
//
// # The model
//
// A process is a list of named services, started in order by one lifecycle and stopped in
// reverse order, so that each service stops while everything it was started on still runs.
// Both processes take the same steps in the same order:
//
//  1. load the config file (config.Load; an unusable one is a connect.ErrConfig error, exit 2),
//     and make the "tracing" service's tracer from its tracing section (nil, off, without one):
//     started first, it stops last and flushes the spans of everything stopped before it;
//  2. connect the stores: "redis" (limiter state and the leak schedule; memory without a redis
//     section) and "nats" (the queues; the quickstart's "embedded nats" without a nats section);
//  3. serve the admin API: health, readiness and metrics; the ingress adds the queue reads and
//     the operating API. The worker serves it before step 4, so /readyz says why it does not
//     drain while NATS is down;
//  4. "queues": openQueues retries until NATS answers (100ms doubling to 5s, jittered, by
//     retry.Policy), then provisions the streams — the one connect policy. The worker waits
//     for it; the ingress with a nats section opens them in the background behind lateQueues,
//     which answers 503 at once until then (and for a queue whose JetStream stops answering,
//     one trial publish at a time), so the listeners serve while NATS is down. A queue that
//     cannot be provisioned keeps /readyz of both at 503, naming it and the fix, while the
//     attempts go on; a misconfiguration no attempt can mend (nats.replicas above 1 against a
//     server without a JetStream cluster) stops the process with a config error at once;
//  5. run: the ingress serves its "listener" (ingress.Server: rules, forward, 429, defer) and,
//     with embedded NATS, "in-process workers"; the worker runs its "workers" (worker.Pool),
//     and reports ready once every queue's runner has its consumer (worker.Pool.Started).
//     Beside the workers, "leftovers" removes jobs that left their queue but stayed in its
//     stream after a fault (leftovers.go), and with embedded NATS "embedded store" says when its
//     store failed to write and when it has room again, for a restart (embeddedstore.go);
//     With rls_listen the ingress also serves Envoy's rate-limit service ("rls": its domain
//     files loaded and its listener opened; "rls listener", gRPC, internal/rls; "rls watcher",
//     optional, which reloads the domain files when their directory changes), counting with
//     the ingress's limiter store and in its sluice_decisions_total;
//  6. "config watcher": reload on SIGHUP and on file change, by the one reload policy below;
//  7. when Run's ctx ends, stop every started service in reverse order under one context that
//     ends shutdown_timeout later (the current config's). The worker pool starts its own
//     graceful drain as soon as ctx ends, beside the ingress's HTTP shutdown.
//
// # Guarantees
//
// A start that fails stops what was started and returns an error prefixed with the process and
// the service ("ingress: listen: …"); a failure of the config is still a connect.ErrConfig. A
// background service that ends on its own with an error (a listener, the pool) stops the
// process, and Run returns that error; the config watcher alone is optional: a process that
// cannot watch its file logs why and serves on. Run returns nil after a shutdown it was asked
// for, also one asked for while it still waited for NATS.
//
// One reload policy: an invalid or unreadable file, or a valid one that a step (provision the
// queues, check the rules the rate-limit service's descriptors name, swap the rules, update
// the pool; in that order) cannot apply, is refused — logged with
// the step, counted in sluice_config_reload_errors_total (the one reload metric), and the
// current config stays. Steps before a failed one stay applied: provisioning only adds and
// updates streams, and the swaps fail only for a file Parse accepted that a component cannot run.
// Keys read only at start-up (listen, admin_listen, redis, nats, …) are named in a warning.
//
// # Costs
//
// Nothing on the request path: the lifecycle runs at start and stop, a reload once per change.
// A stop waits for each background service to return, so a service that ignores its context
// holds the shutdown; every service here returns within the shutdown budget. History and the
// alternatives not taken: docs/design/app.md.
package app
