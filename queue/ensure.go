package queue

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// Every process provisions the queues it uses, at start and on each reload, so most
// provisions find their streams, consumers and buckets as they want them. jetstream's
// CreateOrUpdate* would send an update all the same, which the server applies to the store
// while other processes create consumers on it; the ensure* calls look first and leave alone
// what already matches, so a steady deployment sends no updates at all.

// ensureStream returns the stream cfg names, created or updated to cfg unless it exists with
// cfg's settings already.
func (q *core) ensureStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := q.js.Stream(ctx, cfg.Name)
	if err == nil && sameStream(st.CachedInfo().Config, cfg) {
		return st, nil
	}
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, err
	}
	if err != nil {
		return q.createStream(ctx, cfg)
	}
	st, err = q.js.CreateOrUpdateStream(ctx, keepHoldStamp(st.CachedInfo().Config, cfg))
	return st, classify(err)
}

// keepHoldStamp is the update of stream have to cfg with the hold stamp have has (none when it
// has none): only ensureHoldAs, which has looked at the hold, stamps an existing stream.
func keepHoldStamp(have, cfg jetstream.StreamConfig) jetstream.StreamConfig {
	stamp, had := have.Metadata[holdStampKey]
	if _, wants := cfg.Metadata[holdStampKey]; !wants && !had {
		return cfg
	}
	cfg.Metadata = maps.Clone(cfg.Metadata)
	delete(cfg.Metadata, holdStampKey)
	if had {
		if cfg.Metadata == nil {
			cfg.Metadata = map[string]string{}
		}
		cfg.Metadata[holdStampKey] = stamp
	}
	return cfg
}

// createStream is ensureStream for a stream known to be missing: it creates it in one request
// (CreateOrUpdateStream would try an update first). Another process may have made it
// meanwhile: as cfg, the creation returns it unchanged; with other settings, it is looked up
// and updated (ensureStream: a hold stamp it lacks is not added).
func (q *core) createStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := q.js.CreateStream(ctx, cfg)
	if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return st, classify(err)
	}
	return q.ensureStream(ctx, cfg)
}

// classify wraps the JetStream errors of a creation that retrying will not mend soon in this
// package's sentinels: ErrNoCluster, ErrNoStore.
func classify(err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return err
	}
	switch apiErr.ErrorCode {
	case 10074: // JSStreamReplicasNotSupportedErr: replicas > 1 not supported in non-clustered mode
		return fmt.Errorf("%w: %w", ErrNoCluster, err)
	case 10047: // JSStorageResourcesExceededErr: insufficient storage resources available
		return fmt.Errorf("%w: %w", ErrNoStore, err)
	}
	return err
}

// sameStream reports whether have holds every setting want sets (the server fills in the
// zero ones with its defaults, which count as set as want leaves them).
func sameStream(have, want jetstream.StreamConfig) bool {
	return have.Description == want.Description && slices.Equal(have.Subjects, want.Subjects) &&
		have.Retention == want.Retention && have.Discard == want.Discard &&
		unlimited(have.MaxMsgs) == unlimited(want.MaxMsgs) && unlimited(have.MaxBytes) == unlimited(want.MaxBytes) &&
		have.MaxAge == want.MaxAge && unlimited(have.MaxMsgsPerSubject) == unlimited(want.MaxMsgsPerSubject) &&
		have.Storage == want.Storage && have.Replicas == max(want.Replicas, 1) &&
		(want.Duplicates == 0 || have.Duplicates == want.Duplicates) &&
		have.AllowDirect == want.AllowDirect &&
		(have.RePublish == nil) == (want.RePublish == nil) && (want.RePublish == nil || *have.RePublish == *want.RePublish)
}

// unlimited maps JetStream's two spellings of "no limit", 0 and -1, to one.
func unlimited(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// ensureConsumer is ensureStream for a durable consumer of stream. It returns the consumer.
func (q *core) ensureConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := q.js.Consumer(ctx, stream, cfg.Durable)
	if err == nil {
		have := c.CachedInfo().Config
		if have.Description == cfg.Description && have.AckPolicy == cfg.AckPolicy &&
			have.AckWait == cfg.AckWait && have.MaxDeliver == cfg.MaxDeliver &&
			have.MaxAckPending == cfg.MaxAckPending && have.DeliverPolicy == cfg.DeliverPolicy &&
			have.InactiveThreshold == cfg.InactiveThreshold {
			return c, nil
		}
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, err
	}
	c, err = q.js.CreateOrUpdateConsumer(ctx, stream, cfg)
	return c, classify(err)
}

// createConsumer is ensureConsumer for a consumer known to be missing (its stream holds
// none): one request. One that another process made meanwhile with other settings is
// updated.
func (q *core) createConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := q.js.CreateConsumer(ctx, stream, cfg)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		return q.ensureConsumer(ctx, stream, cfg)
	}
	return c, classify(err)
}

// ensureKeyValue is ensureStream for a key-value bucket.
func (q *core) ensureKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) error {
	kv, err := q.js.KeyValue(ctx, cfg.Bucket)
	if err == nil {
		if st, err := kv.Status(ctx); err == nil {
			info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
			if st.TTL() == cfg.TTL && st.History() == int64(max(cfg.History, 1)) &&
				info.Config.Storage == cfg.Storage && info.Config.Replicas == max(cfg.Replicas, 1) &&
				info.Config.Description == cfg.Description {
				return nil
			}
		}
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return err
	}
	_, err = q.js.CreateOrUpdateKeyValue(ctx, cfg)
	return classify(err)
}
