package app

import (
	"context"
	"fmt"
	"net"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/rls"
)

// rlsServices are those of the Envoy rate-limit service (rls_listen), after the rules (whose
// sluice_decisions_total it counts in too) and the other listeners: build it from its domain
// files and open its listener, serve it, and watch its directory.
func (p *ingressProc) rlsServices(lc *lifecycle) []service {
	return []service{
		{name: "rls", start: p.startRLS, stop: p.closeRLS},
		lc.run("rls listener", background{}, func(ctx context.Context) error {
			return p.rls.Serve(ctx, p.rlsLn, p.current.Load().ShutdownTimeout)
		}),
		lc.run("rls watcher", background{optional: true}, func(ctx context.Context) error {
			return p.rls.Watch(ctx, 0, func(err error) {
				if err != nil {
					p.adm.ReloadFailed()
				}
			})
		}),
	}
}

// startRLS loads the domain files, counting with the ingress's limiter, and listens.
func (p *ingressProc) startRLS(context.Context) error {
	cfg := p.current.Load()
	opts := rls.Options{Limiter: p.lim, Registerer: p.reg, Logger: p.log}
	if p.holder != nil {
		opts.RegionalLimit = p.regionalLimit // the HTTP path's holder: one share, one demand
	}
	srv, err := rls.New(cfg, opts)
	if err != nil {
		return connect.ConfigError(fmt.Errorf("%s: rls: %w", cfg.Path, err))
	}
	p.rls = srv
	if p.rlsLn, err = net.Listen("tcp", cfg.RLSListen); err != nil {
		return fmt.Errorf("rls_listen: %w", err)
	}
	p.log.Info("ingress: Envoy rate-limit service", "addr", p.rlsLn.Addr().String(), "config_dir", cfg.RLS.ConfigDir)
	return nil
}

// closeRLS closes the listener if the server never took it over; closing one it closed does
// nothing.
func (p *ingressProc) closeRLS(context.Context) error {
	if p.rlsLn != nil {
		p.rlsLn.Close()
	}
	return nil
}

// rlsStep is the reload step of the rate-limit service: the rules its descriptors name must
// stay usable. Then the domain files are read again too (a SIGHUP reloads them as it reloads
// the config file); domain files that do not compile keep the domains in force, are logged and
// counted, and do not refuse the config's reload.
func (p *ingressProc) rlsStep() reloadStep {
	return reloadStep{"rls", func(_ context.Context, next *config.Config) error {
		if err := p.rls.SetConfig(next); err != nil {
			return err
		}
		if p.rls.Reload() != nil {
			p.adm.ReloadFailed()
		}
		return nil
	}}
}
