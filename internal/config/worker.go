package config

import "strconv"

// Worker is the worker section: how a worker process sends its deliveries.
type Worker struct {
	// NetHTTPOnly sends every delivery through Go's net/http client (YAML
	// worker.direct_http: false). false, the default (direct_http: true): a delivery to a plain
	// http:// upstream that no proxy serves is sent from the job's goroutine by package h1,
	// which costs less CPU per job; https and proxied ones go through net/http either way.
	// It applies on reload, to the deliveries that start from then on.
	NetHTTPOnly bool
}

type rawWorker struct {
	DirectHTTP *scalar `yaml:"direct_http"`
}

// worker reads the worker section: direct_http is a boolean, true when absent.
func (b *builder) worker(c *Config, raw *rawWorker) {
	if raw == nil {
		return
	}
	s := b.text("", "worker.direct_http", raw.DirectHTTP, "true")
	on, err := strconv.ParseBool(s)
	if err != nil {
		b.p.addf("", "worker.direct_http", "worker.direct_http: want true or false, got %q", s)
		return
	}
	c.Worker.NetHTTPOnly = !on
}
