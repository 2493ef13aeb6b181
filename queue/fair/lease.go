package fair

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

const (
	// leaseRenew is how often the holder renews the lease; leaseExpire is how long a lease
	// left unrenewed keeps the others from taking it over.
	leaseRenew  = 500 * time.Millisecond
	leaseExpire = 2 * time.Second
)

// lease makes one of the processes that run a queue's scheduler its leader. It is an entry of
// a key-value bucket whose revision its holder advances every leaseRenew; another process takes
// it over, by compare-and-set on the revision it saw, once that revision has stood still for
// leaseExpire on its own clock, so no two clocks are compared. An empty value is a lease given
// up, free to take at once. It is not safe for concurrent use.
type lease struct {
	kv    jetstream.KeyValue
	key   string
	owner string           // this holder's random id, the entry's value while it holds it
	now   func() time.Time // time.Now; tests move it

	rev     uint64    // revision of our entry while we hold the lease; 0: not held
	seenRev uint64    // revision last seen while another held it
	seenAt  time.Time // when seenRev was first seen
}

func newLease(kv jetstream.KeyValue, key string) *lease {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return &lease{kv: kv, key: key, owner: hex.EncodeToString(id[:]), now: time.Now}
}

// held reports whether the last renew left the lease ours.
func (l *lease) held() bool { return l.rev != 0 }

// renew takes, renews or loses the lease, and reports whether it is ours now. An error
// (the bucket unreachable) leaves it not held.
func (l *lease) renew(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if l.rev != 0 {
		rev, err := l.kv.Update(ctx, l.key, []byte(l.owner), l.rev)
		l.rev = ifOK(rev, err) // lost: another took it over, or we cannot tell
		return l.held(), err
	}
	e, err := l.kv.Get(ctx, l.key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		rev, err := l.kv.Create(ctx, l.key, []byte(l.owner))
		l.rev = ifOK(rev, err)
		return l.held(), lostRace(err)
	case err != nil:
		return false, err
	}
	if len(e.Value()) != 0 { // held by another
		if e.Revision() != l.seenRev {
			l.seenRev, l.seenAt = e.Revision(), l.now()
			return false, nil
		}
		if l.now().Sub(l.seenAt) < leaseExpire {
			return false, nil
		}
	}
	rev, err := l.kv.Update(ctx, l.key, []byte(l.owner), e.Revision())
	l.rev = ifOK(rev, err)
	return l.held(), lostRace(err)
}

// ifOK is rev, or 0 when err is not nil.
func ifOK(rev uint64, err error) uint64 {
	if err != nil {
		return 0
	}
	return rev
}

// lostRace is err, or nil when it says another process changed the entry first.
func lostRace(err error) error {
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrKeyExists) || (errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence) {
		return nil
	}
	return err
}

// release gives the lease up, if held, so that another process takes it over at once.
func (l *lease) release(ctx context.Context) {
	if l.rev == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, _ = l.kv.Update(ctx, l.key, nil, l.rev)
	l.rev = 0
}
