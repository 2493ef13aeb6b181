package connect

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ErrEvicts is returned (wrapped) by CheckEviction when a Redis server may evict keys to make
// room: Sluice's limiter state and leak schedule would then be forgotten under memory
// pressure, and an exhausted key would be allowed again (429 → 200).
var ErrEvicts = errors.New("redis may evict Sluice's keys")

// CheckEviction reports whether rdb's servers can evict Sluice's keys. They cannot when
// maxmemory is 0 (no limit) or maxmemory-policy is noeviction (writes fail instead, which
// Sluice sees as a store error). Every volatile-* policy can: Sluice's keys carry TTLs. On a
// Redis Cluster every master is asked. A server that refuses CONFIG GET (managed services may
// rename it) cannot be checked: CheckEviction returns nil and reports it in unchecked, for the
// caller to log.
func CheckEviction(ctx context.Context, rdb redis.UniversalClient) (unchecked []string, err error) {
	var (
		mu   sync.Mutex
		errs []error
	)
	check := func(ctx context.Context, c *redis.Client) error {
		problem, cerr := evictionOf(ctx, c)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case cerr != nil:
			unchecked = append(unchecked, fmt.Sprintf("%s: %v", c.Options().Addr, cerr))
		case problem != "":
			errs = append(errs, fmt.Errorf("%w: %s on %s: set maxmemory-policy noeviction (or maxmemory 0)",
				ErrEvicts, problem, c.Options().Addr))
		}
		return nil
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		if err := c.ForEachMaster(ctx, check); err != nil {
			return unchecked, err
		}
	case *redis.Client:
		_ = check(ctx, c)
	default:
		return []string{"not a redis.Client or ClusterClient"}, nil
	}
	return unchecked, errors.Join(errs...)
}

// evictionOf returns what lets c's server evict keys ("" when nothing does), or the error of
// asking it.
func evictionOf(ctx context.Context, c *redis.Client) (string, error) {
	res, err := c.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		return "", err
	}
	policy, ok := res["maxmemory-policy"]
	if !ok {
		return "", errors.New("CONFIG GET returned no maxmemory-policy")
	}
	limit, _ := strconv.ParseInt(res["maxmemory"], 10, 64)
	if limit == 0 || strings.EqualFold(policy, "noeviction") {
		return "", nil
	}
	return fmt.Sprintf("maxmemory %d with maxmemory-policy %s", limit, policy), nil
}
