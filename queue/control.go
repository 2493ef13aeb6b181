package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Operator is the role of a [Queues] that carries the operators' decisions to every process:
// the queues' controls (Control, Controls, SetControl, WatchControls) and the cancellation of
// jobs (Cancel, WatchCancels). Get it from a Queues (its zero value is not usable); it shares
// the Queues' connection, and is safe for concurrent use.
type Operator struct{ *core }

// Control is what an operator set on a queue at run time, kept in the meta bucket so that every
// worker applies it within a second and it survives restarts. The zero value is "no control".
type Control struct {
	// Paused stops deliveries of the queue on every worker; PausedUntil, when not zero, ends
	// the pause by itself.
	Paused      bool      `json:"paused,omitempty"`
	PausedUntil time.Time `json:"paused_until,omitzero"`
	// Rate replaces the config file's rate ("40/s"); "" keeps the file's.
	Rate string `json:"rate,omitempty"`
	// Tenants are single tenants' settings of a fair queue, by tenant id, replacing the config
	// file's for that tenant. They are read from one key each (SetTenantControl); in the
	// queue's own entry only as an older version wrote them (see tenantcontrol.go).
	Tenants map[string]TenantControl `json:"tenants,omitempty"`
}

// TenantControl is what an operator set for one tenant of a fair queue at run time; a zero
// field keeps the config file's setting.
type TenantControl struct {
	// Weight is its weight in the round robin, > 0.
	Weight float64 `json:"weight,omitempty"`
	// Rate caps its deliveries ("5/s"), in place of the queue's tenant_rate.
	Rate string `json:"rate,omitempty"`
	// InFlight caps its deliveries in flight at once, in place of the queue's tenant_in_flight.
	InFlight int64 `json:"in_flight,omitempty"`
}

// IsZero reports whether c sets nothing.
func (c TenantControl) IsZero() bool { return c == TenantControl{} }

// PausedAt reports whether the control pauses the queue at now.
func (c Control) PausedAt(now time.Time) bool {
	return c.Paused && (c.PausedUntil.IsZero() || now.Before(c.PausedUntil))
}

const controlPrefix = "ctl."

// ErrConflict is returned (wrapped) by Cancel for a job that can no longer be canceled: it is
// being delivered, or already succeeded or failed.
var ErrConflict = errors.New("queue: conflict")

// SetControl changes queue's control with change, atomically against other operators, and
// returns the queue's entry as stored. It carries the queue-wide fields (pause, runtime rate);
// a tenant's settings are SetTenantControl's, in their own keys (change sees none).
func (o Operator) SetControl(ctx context.Context, queue string, change func(*Control)) (Control, error) {
	if _, ok := o.spec(queue); !ok {
		return Control{}, fmt.Errorf("%w: %q", ErrUnknownQueue, queue)
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	if err := o.migrateTenants(ctx, queue); err != nil {
		return Control{}, err
	}
	key := controlPrefix + queue
	for range 20 {
		var c Control
		var rev uint64
		e, err := o.meta.Get(ctx, key)
		switch {
		case err == nil:
			_ = json.Unmarshal(e.Value(), &c)
			rev = e.Revision()
		case !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted):
			return Control{}, fmt.Errorf("queue: control %q: %w", queue, err)
		}
		change(&c)
		data, _ := json.Marshal(c)
		if rev == 0 {
			_, err = o.meta.Create(ctx, key, data)
		} else {
			_, err = o.meta.Update(ctx, key, data, rev)
		}
		if err == nil {
			return c, nil
		}
		if !isConflict(err) {
			return Control{}, fmt.Errorf("queue: control %q: %w", queue, err)
		}
	}
	return Control{}, fmt.Errorf("queue: control %q: too many concurrent changes", queue)
}

// Control returns the operators' control of queue name (see Control), its tenants' settings
// included; the zero Control when there is none. One read of the queue's entry and one of
// its tenants' keys (a watch that ends once they are in).
func (o Operator) Control(ctx context.Context, name string) (Control, error) {
	cs, err := o.readControls(ctx, []string{controlPrefix + name, tenantControlPrefix + name + ".*"})
	if err != nil {
		return Control{}, fmt.Errorf("queue: control %q: %w", name, err)
	}
	return cs[name], nil
}

// Controls returns the control of every queue that has one, with its tenants' settings: one
// read of the controls' keys (a watch that ends once they are in, whose consumer it deletes),
// its cost in proportion to the queues and tenants with settings.
func (o Operator) Controls(ctx context.Context) (map[string]Control, error) {
	cs, err := o.readControls(ctx, controlKeys())
	if err != nil {
		return nil, fmt.Errorf("queue: controls: %w", err)
	}
	return cs, nil
}

// readControls reads the current values of the control keys keys once.
func (o Operator) readControls(ctx context.Context, keys []string) (map[string]Control, error) {
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	w, err := o.meta.WatchFiltered(ctx, keys, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	v := newControlsView()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("watch closed")
			}
			if e == nil { // the current values are all in
				return v.merged(), nil
			}
			v.apply(e)
		}
	}
}

// WatchControls calls apply with the controls of every queue now and after each change, until
// ctx ends; a change reaches every watcher within milliseconds. It returns ctx's error, or the
// error of starting the watch.
func (o Operator) WatchControls(ctx context.Context, apply func(map[string]Control)) error {
	w, err := o.meta.WatchFiltered(ctx, controlKeys())
	if err != nil {
		return fmt.Errorf("queue: watch controls: %w", err)
	}
	defer w.Stop()
	v := newControlsView()
	initial := true
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("queue: watch controls: closed")
			}
			if e == nil { // the initial values are all in
				initial = false
				apply(v.merged())
				continue
			}
			if v.apply(e) && !initial {
				apply(v.merged())
			}
		}
	}
}

// Cancel cancels job id before its delivery: its status becomes canceled (so a worker that
// takes or already holds it drops it, see the worker), and its message is removed from its
// queue. It returns the new status, ErrNotFound for an unknown id, or an error wrapping
// ErrConflict when the job is being delivered or is already final.
func (o Operator) Cancel(ctx context.Context, id string) (Status, error) {
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	st, err := Publisher(o).Status(ctx, id)
	if err != nil {
		return Status{}, err
	}
	var out Status
	err = o.updateStatus(ctx, id, func(cur *record) *record {
		base := st
		if cur != nil {
			base = cur.Status
		}
		if base.State.Terminal() || base.State == StateRunning {
			out = base
			return nil
		}
		next := record{Status: base, Tenant: st.Tenant}
		if cur != nil {
			next = *cur
		}
		next.State, next.LastError, next.UpdatedAt = StateCanceled, "canceled by an operator", time.Time{}
		out = next.Status
		return &next
	})
	if err != nil {
		return Status{}, err
	}
	if out.State != StateCanceled {
		return out, fmt.Errorf("%w: job %s is %s", ErrConflict, id, out.State)
	}
	if st.NotBefore != nil {
		o.unschedule(ctx, out.Queue, id)
	}
	if rec, _, err := o.getRecord(ctx, id); err == nil && rec.BacklogSeq != 0 {
		if backlog, err := o.js.Stream(ctx, o.backlogStreamName(out.Queue)); err == nil {
			if raw, err := backlog.GetMsg(ctx, rec.BacklogSeq); err == nil && backlog.DeleteMsg(ctx, rec.BacklogSeq) == nil {
				o.releaseMsg(ctx, raw.Header)
			} // not there: it was moved on, see below
		}
	}
	o.deleteWaiting(ctx, out.Queue, id)
	o.announceCancel(id)
	out.State = StateCanceled
	return out, nil
}

// stream returns queue's stream, if it is provisioned here.
func (q *core) stream(queue string) (jetstream.Stream, bool) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	st, ok := q.streams[queue]
	return st, ok
}

func (q *core) cancelSubject() string { return q.opts.Prefix + ".cancel" }

// announceCancel tells the workers that job id was canceled, so that one that holds it drops
// it before sending. Best effort: a worker that misses it reads the status on a redelivery.
func (q *core) announceCancel(id string) { _ = q.nc.Publish(q.cancelSubject(), []byte(id)) }

// WatchCancels calls fn with the id of every job canceled from now on (by Cancel, in any
// process), until ctx ends.
func (o Operator) WatchCancels(ctx context.Context, fn func(id string)) error {
	sub, err := o.nc.Subscribe(o.cancelSubject(), func(m *nats.Msg) { fn(string(m.Data)) })
	if err != nil {
		return fmt.Errorf("queue: watch cancels: %w", err)
	}
	<-ctx.Done()
	_ = sub.Unsubscribe()
	return ctx.Err()
}
