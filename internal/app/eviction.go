package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/admin"
	"github.com/sluice-rl/sluice/internal/connect"
)

// refuseEviction refuses to start on a Redis that may evict Sluice's keys: limiter state
// forgotten under memory pressure lets an exhausted key through again (connect.CheckEviction);
// and on one that will not run Lua (refuseNoLua).
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
	return refuseNoLua(ctx, rdb, path)
}

// refuseNoLua refuses to start on a Redis that will not run Lua scripts (EVAL renamed or
// disabled, as some managed services do): every limiter decision, leak slot and place is one,
// and each would fail at run time. A Redis that does not answer is left to the readiness check.
//
// It also refuses credentials the server refuses (a wrong or missing password or user in
// redis.url: WRONGPASS, NOAUTH), which no retry mends, naming redis.url; the URL is not
// written, so neither is its password.
func refuseNoLua(ctx context.Context, rdb redis.UniversalClient, path string) error {
	err := rdb.Eval(ctx, "return 1", nil).Err()
	if err != nil && connect.RefusedCredentials(err) {
		return connect.ConfigError(fmt.Errorf("%s: redis.url: the Redis server refused the credentials: %v", path, err))
	}
	if err != nil && strings.Contains(strings.ToLower(err.Error()), "unknown command") {
		return connect.ConfigError(fmt.Errorf("%s: redis: the server does not run Lua scripts (%v): Sluice needs EVAL and EVALSHA, as every limiter decision and leak slot is one script; use a Redis that allows them", path, err))
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
