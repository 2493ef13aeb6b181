package connect

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// reloadOnFailure is a go-redis hook of a cluster client that asks it to reload the cluster's
// slot map (CLUSTER SLOTS of a node that answers) whenever a command or pipeline fails
// without a server's reply, or with CLUSTERDOWN or TRYAGAIN. go-redis reloads it by itself
// only on a MOVED or ASK reply, and every ClusterStateReloadInterval (a minute); a master that
// died answers neither, so without this hook a client kept sending its slots' commands to the
// dead address for up to a minute after its replica had taken over. A reload is one
// CLUSTER SLOTS in the background, at most one every 200 ms (go-redis's cooldown), only while
// calls fail.
type reloadOnFailure struct{ c *redis.ClusterClient }

func (h reloadOnFailure) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnFailure) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.check(err)
		return err
	}
}

func (h reloadOnFailure) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.check(err)
		return err
	}
}

// check reloads the slot map when err says the node asked may not serve its slots any more.
func (h reloadOnFailure) check(err error) {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return
	}
	var re redis.Error
	if errors.As(err, &re) && !strings.HasPrefix(re.Error(), "CLUSTERDOWN") && !strings.HasPrefix(re.Error(), "TRYAGAIN") {
		return // the server answered: its own error, not a topology's
	}
	h.c.ReloadState(context.Background())
}
