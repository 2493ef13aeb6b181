package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Tenant controls: one key of the meta bucket per tenant with settings of its own,
// "tctl.<queue>.<tenant id>", beside the queue's own "ctl.<queue>". A PATCH of one tenant
// writes one small entry, and a queue may keep as many as the caller's cap allows (no single
// value grows toward NATS's max payload, as the one map in the queue's entry did: the 8 594th
// tenant no longer fails).
//
// Versions before kept every tenant's settings in the queue's entry (Control.Tenants). They are
// read still, under the per-tenant keys (which win), and moved to their own keys by the first
// write of the queue's controls (migrateTenants), after which the queue's entry holds none.

const tenantControlPrefix = "tctl."

// ErrTooManyTenants is returned (wrapped) by SetTenantControl when the queue has settings for
// as many tenants as the cap allows already.
var ErrTooManyTenants = errors.New("queue: too many tenants with settings of their own")

func tenantControlKey(queue, tenant string) string { return tenantControlPrefix + queue + "." + tenant }

// parseTenantControlKey returns the queue and tenant of a per-tenant control key.
func parseTenantControlKey(key string) (queue, tenant string, ok bool) {
	rest, ok := strings.CutPrefix(key, tenantControlPrefix)
	if !ok {
		return "", "", false
	}
	return strings.Cut(rest, ".")
}

// SetTenantControl changes the settings of tenant of queue with change, atomically against
// other operators, and returns them as stored; settings that come out zero are deleted. A
// tenant not yet set is refused with ErrTooManyTenants when the queue has max tenants set
// already (max <= 0: no cap). Cost: one read and one write of the tenant's key; a new tenant
// also lists the queue's tenant keys once (to hold the cap).
func (o Operator) SetTenantControl(ctx context.Context, queue, tenant string, max int, change func(*TenantControl)) (TenantControl, error) {
	if _, ok := o.spec(queue); !ok {
		return TenantControl{}, fmt.Errorf("%w: %q", ErrUnknownQueue, queue)
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	if err := o.migrateTenants(ctx, queue); err != nil {
		return TenantControl{}, err
	}
	key := tenantControlKey(queue, tenant)
	for range 20 {
		var tc TenantControl
		var rev uint64
		e, err := o.meta.Get(ctx, key)
		switch {
		case err == nil:
			_ = json.Unmarshal(e.Value(), &tc)
			rev = e.Revision()
		case !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted):
			return TenantControl{}, fmt.Errorf("queue: tenant control %q: %w", queue, err)
		}
		change(&tc)
		switch {
		case tc.IsZero() && rev == 0:
			return tc, nil
		case tc.IsZero():
			err = o.meta.Delete(ctx, key, jetstream.LastRevision(rev))
		case rev != 0:
			_, err = o.meta.Update(ctx, key, mustJSON(tc), rev)
		default:
			if max > 0 {
				n, cerr := o.countTenantControls(ctx, queue, max)
				if cerr != nil {
					return TenantControl{}, cerr
				}
				if n >= max {
					return TenantControl{}, fmt.Errorf("%w: queue %q has settings for %d tenants", ErrTooManyTenants, queue, n)
				}
			}
			_, err = o.meta.Create(ctx, key, mustJSON(tc))
		}
		if err == nil {
			return tc, nil
		}
		if !isConflict(err) && !errors.Is(err, jetstream.ErrKeyExists) {
			return TenantControl{}, fmt.Errorf("queue: tenant control %q: %w", queue, err)
		}
	}
	return TenantControl{}, fmt.Errorf("queue: tenant control %q: too many concurrent changes", queue)
}

// countTenantControls counts queue's tenant keys, up to max. While the whole meta bucket
// holds fewer keys than max (deleted ones included), that number bounds the count, and one
// stream info is all it costs; past that it lists the queue's tenant keys. Two operators
// adding tenants at once near the cap may both pass: the cap holds within the writers at once.
func (o Operator) countTenantControls(ctx context.Context, queue string, max int) (int, error) {
	if st, err := o.js.Stream(ctx, "KV_"+o.metaBucketName()); err == nil {
		if n := st.CachedInfo().State.NumSubjects; n < uint64(max) {
			return int(n), nil // an upper bound, below the cap
		}
	}
	l, err := o.meta.ListKeysFiltered(ctx, tenantControlPrefix+queue+".*")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return 0, nil
		}
		return 0, fmt.Errorf("queue: tenant controls %q: %w", queue, err)
	}
	defer l.Stop()
	n := 0
	for range l.Keys() {
		if n++; n >= max {
			break
		}
	}
	return n, nil
}

// migrateTenants moves the tenant settings an older version kept in queue's entry to their
// own keys (an existing per-tenant key wins), then removes them from the entry. Nothing to
// move costs one read.
func (q *core) migrateTenants(ctx context.Context, queue string) error {
	key := controlPrefix + queue
	for range 20 {
		e, err := q.meta.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("queue: control %q: %w", queue, err)
		}
		var c Control
		if json.Unmarshal(e.Value(), &c) != nil || len(c.Tenants) == 0 {
			return nil
		}
		for id, tc := range c.Tenants {
			if tc.IsZero() {
				continue
			}
			if _, err := q.meta.Create(ctx, tenantControlKey(queue, id), mustJSON(tc)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
				return fmt.Errorf("queue: move tenant settings of %q: %w", queue, err)
			}
		}
		c.Tenants = nil
		if _, err = q.meta.Update(ctx, key, mustJSON(c), e.Revision()); err == nil {
			return nil
		} else if !isConflict(err) {
			return fmt.Errorf("queue: move tenant settings of %q: %w", queue, err)
		}
	}
	return fmt.Errorf("queue: move tenant settings of %q: too many concurrent changes", queue)
}

// controlsView is the controls of every queue as the meta bucket holds them, by key.
type controlsView struct {
	queues  map[string]Control                  // by queue: the queue's entry
	tenants map[string]map[string]TenantControl // by queue, by tenant id: the per-tenant keys
}

func newControlsView() *controlsView {
	return &controlsView{queues: map[string]Control{}, tenants: map[string]map[string]TenantControl{}}
}

// apply records the entry e of the meta bucket (or its deletion), and reports whether it is a
// control's.
func (v *controlsView) apply(e jetstream.KeyValueEntry) bool {
	put := e.Operation() == jetstream.KeyValuePut
	if name, ok := strings.CutPrefix(e.Key(), controlPrefix); ok {
		var c Control
		if put && json.Unmarshal(e.Value(), &c) == nil {
			v.queues[name] = c
		} else {
			delete(v.queues, name)
		}
		return true
	}
	queue, tenant, ok := parseTenantControlKey(e.Key())
	if !ok {
		return false
	}
	var tc TenantControl
	if put && json.Unmarshal(e.Value(), &tc) == nil && !tc.IsZero() {
		if v.tenants[queue] == nil {
			v.tenants[queue] = map[string]TenantControl{}
		}
		v.tenants[queue][tenant] = tc
	} else {
		delete(v.tenants[queue], tenant)
	}
	return true
}

// merged returns the controls of every queue that has one, each with its tenants' settings:
// an older version's in its entry, under the per-tenant keys'.
func (v *controlsView) merged() map[string]Control {
	out := make(map[string]Control, len(v.queues)+len(v.tenants))
	for name, c := range v.queues {
		out[name] = c
	}
	for name, ts := range v.tenants {
		if len(ts) == 0 {
			continue
		}
		c := out[name]
		tenants := make(map[string]TenantControl, len(c.Tenants)+len(ts))
		for id, tc := range c.Tenants {
			tenants[id] = tc
		}
		for id, tc := range ts {
			tenants[id] = tc
		}
		c.Tenants = tenants
		out[name] = c
	}
	return out
}

// controlKeys are the meta bucket's keys of the controls, for a watch.
func controlKeys() []string { return []string{controlPrefix + "*", tenantControlPrefix + "*.*"} }

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// QueueControls returns the queue-wide control of every queue that has one (pause, runtime
// rate), without the per-tenant keys: one read of as many entries as queues, whatever the
// tenants with settings. (Tenants holds what an older version kept in the queue's entry.)
func (o Operator) QueueControls(ctx context.Context) (map[string]Control, error) {
	cs, err := o.readControls(ctx, []string{controlPrefix + "*"})
	if err != nil {
		return nil, fmt.Errorf("queue: controls: %w", err)
	}
	return cs, nil
}

// TenantControl returns the settings of tenant of queue, and false when it has none: one read
// of its key (and of the queue's entry when the key is absent, for an older version's).
func (o Operator) TenantControl(ctx context.Context, queue, tenant string) (TenantControl, bool, error) {
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	e, err := o.meta.Get(ctx, tenantControlKey(queue, tenant))
	switch {
	case err == nil:
		var tc TenantControl
		if err := json.Unmarshal(e.Value(), &tc); err != nil {
			return TenantControl{}, false, fmt.Errorf("queue: tenant control %q: %w", queue, err)
		}
		return tc, !tc.IsZero(), nil
	case !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted):
		return TenantControl{}, false, fmt.Errorf("queue: tenant control %q: %w", queue, err)
	}
	cs, err := o.readControls(ctx, []string{controlPrefix + queue})
	if err != nil {
		return TenantControl{}, false, fmt.Errorf("queue: tenant control %q: %w", queue, err)
	}
	tc, ok := cs[queue].Tenants[tenant]
	return tc, ok, nil
}

// TenantCounts returns how many tenants of each queue have settings of their own: one listing
// of the per-tenant keys (their names, not their values), and the queues' entries for an
// older version's.
func (o Operator) TenantCounts(ctx context.Context) (map[string]int, error) {
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	seen := map[string]map[string]bool{}
	add := func(queue, tenant string) {
		if seen[queue] == nil {
			seen[queue] = map[string]bool{}
		}
		seen[queue][tenant] = true
	}
	l, err := o.meta.ListKeysFiltered(ctx, tenantControlPrefix+"*.*")
	switch {
	case errors.Is(err, jetstream.ErrNoKeysFound):
	case err != nil:
		return nil, fmt.Errorf("queue: tenant counts: %w", err)
	default:
		for k := range l.Keys() {
			if queue, tenant, ok := parseTenantControlKey(k); ok {
				add(queue, tenant)
			}
		}
		_ = l.Stop()
	}
	qc, err := o.QueueControls(ctx)
	if err != nil {
		return nil, err
	}
	for queue, c := range qc {
		for tenant := range c.Tenants {
			add(queue, tenant)
		}
	}
	out := make(map[string]int, len(seen))
	for queue, ts := range seen {
		out[queue] = len(ts)
	}
	return out, nil
}
