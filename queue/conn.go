package queue

// Reconnects returns how many times the connection to NATS has reconnected since it was made.
// A worker that sees it change knows the server may have restarted, and with it forgotten the
// delivery counts of recently acknowledged jobs (see the worker's recall).
func (q *Queues) Reconnects() uint64 { return q.nc.Stats().Reconnects }
