package app

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/regions"
	"github.com/sluice-rl/sluice/internal/worker"
)

// regionsDeps connects to the coordinator of cfg's regions and returns the worker pool's part
// in global budgets, and the connection to close when the pool is done; nil, nil without
// regions. The connection retries in the background: a coordinator down at start leaves the
// region on its safe share until it answers. A change of the regions section takes a restart.
func regionsDeps(cfg *config.Config, log *slog.Logger) (*worker.Regions, *nats.Conn, error) {
	rs := cfg.Regions
	if rs == nil || cfg.Region == "" {
		return nil, nil, nil
	}
	nc, err := connect.NATS(rs.Coordinator, "sluice-regions-"+cfg.Region, log.With("nats", "regions.coordinator"))
	if err != nil {
		return nil, nil, connect.ConfigError(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	w := &worker.Regions{Coordinator: regions.NewCoordinator(js, cfg.Region, nil), Regions: len(rs.Names),
		SafeShare: rs.SafeRate.PerSecond(), MinShare: rs.MinShare.PerSecond(), Lease: rs.Lease, Renew: rs.Renew}
	if rs.SafeEven {
		w.SafeShare = -1
	}
	return w, nc, nil
}

// closeCoordinator closes the connection to the regions' coordinator, if any.
func closeCoordinator(nc *nats.Conn) {
	if nc != nil {
		nc.Close()
	}
}

func (p *workerProc) closeCoordinator(context.Context) error {
	closeCoordinator(p.coordinator)
	return nil
}
func (p *ingressProc) closeCoordinator(context.Context) error {
	closeCoordinator(p.coordinator)
	return nil
}
