package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/admin"
	"github.com/sluice-rl/sluice/internal/connect"
)

// refuseEviction refuses to start on a Redis that may evict Sluice's keys: limiter state
// forgotten under memory pressure lets an exhausted key through again (connect.CheckEviction).
// A Redis that does not answer yet, or will not tell, is left to the readiness check.
func refuseEviction(ctx context.Context, rdb redis.UniversalClient, path string, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	unchecked, err := connect.CheckEviction(ctx, rdb)
	for _, u := range unchecked {
		log.Warn("redis: cannot read maxmemory-policy; make sure it is noeviction (or maxmemory 0)", "server", u)
	}
	if errors.Is(err, connect.ErrEvicts) {
		return connect.ConfigError(fmt.Errorf("%s: redis: %w", path, err))
	}
	return nil
}

// evictionCheck is the readiness check that Redis cannot evict Sluice's keys, should its
// policy change after the start.
func evictionCheck(rdb redis.UniversalClient) admin.Check {
	return admin.Check{Name: "redis-eviction", Func: func(ctx context.Context) error {
		_, err := connect.CheckEviction(ctx, rdb)
		if errors.Is(err, connect.ErrEvicts) {
			return err
		}
		return nil // unreachable is the "redis" check's to say
	}}
}
