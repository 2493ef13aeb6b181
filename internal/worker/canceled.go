package worker

import (
	"context"
	"sync"
)

// uncanceled is the policy that ends the pass of a job an operator canceled while it waited
// (Pool.canceled, from the cancellations watch). It comes last, so a job canceled while it
// waited for its place or slot is not sent.
type uncanceled struct {
	env      queueEnv
	canceled *sync.Map // job id → when its cancel was announced
}

func (u *uncanceled) admit(_ context.Context, _ *QueueConfig, j *job) verdict {
	if _, canceled := u.canceled.Load(j.m.Job.ID); canceled {
		u.env.logger(j).Info("worker: job canceled by an operator; not delivered")
		return refuse(endCanceled, "canceled by an operator")
	}
	return pass()
}
