package app

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/tracing"
)

// flushTimeout bounds the flush of the spans batched at shutdown: a collector that does not
// answer costs the stop that long at most, never the whole shutdown budget.
const flushTimeout = 3 * time.Second

// tracingService is the "tracing" service, first to start and so last to stop: it makes the
// process's tracer from the config's tracing section into *tr (nil, off, without one) and, at
// stop, flushes the spans of everything stopped before it. The exporter's errors go to log.
func tracingService(tr **tracing.Tracer, cfg *config.Config, proc string, log *slog.Logger) service {
	return service{
		name: "tracing",
		start: func(ctx context.Context) error {
			t, err := tracing.New(ctx, cfg.Tracing, "sluice-"+proc)
			if err != nil {
				return configErrf("%s: %w", cfg.Path, err)
			}
			if t.On() {
				otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
					log.Warn(proc+": tracing: export", "err", err)
				}))
				log.Info(proc+": tracing", "otlp", cfg.Tracing.OTLP, "sample_ratio", cfg.Tracing.SampleRatio)
			}
			*tr = t
			return nil
		},
		stop: func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, flushTimeout)
			defer cancel()
			return (*tr).Shutdown(ctx)
		},
	}
}
