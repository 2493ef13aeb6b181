package queue

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"

	"github.com/google/uuid"
)

// IDs is the id scheme of jobs and tenants: unkeyed job ids that carry a tag of their queue
// ([NewJobID]), and ids derived from an Idempotency-Key or a tenant's key with HMAC-SHA-256
// under the deployment's id secret (Options.IDSecret), so that every process that shares the
// secret derives the same ones. Get it from a Queues. It is a plain value, safe for concurrent
// use.
type IDs struct {
	secret []byte
}

// validID reports whether s is a job id: 1 to 128 of [A-Za-z0-9_-], usable as a KV key and
// as one subject token.
func validID(s string) bool { return isToken(s, 128) }

// isToken reports whether s is 1 to max bytes of [A-Za-z0-9_-], checked by hand as it runs
// for every status write (BenchmarkValidID).
func isToken(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// NewJobID returns a new random id for a job of queue without an Idempotency-Key: a
// time-ordered UUID version 7 whose last 16 bits are a tag of the queue's name (58 bits stay
// random besides the millisecond). [Publisher.Status] finds such a job in its queue's stream by id
// alone, so Publish writes no status entry for it.
func NewJobID(queue string) string {
	id, err := uuid.NewV7()
	if err != nil {
		id = uuid.New()
	}
	tag := queueTag(queue)
	id[14], id[15] = byte(tag>>8), byte(tag)
	return id.String()
}

// JobID returns the id of the job that tenant's Idempotency-Key names on queue: a UUID version
// 8 whose other 122 bits come from HMAC-SHA-256, keyed with the deployment's id secret
// (Options.IDSecret), over the queue, the tenant and the key. The same key of the same tenant on
// the same queue always names the same job, on every process that shares the secret; two
// tenants' keys never meet; and without the secret an id cannot be computed from the key.
func (ids IDs) JobID(queue, tenant, idempotencyKey string) string {
	m := hmac.New(sha256.New, ids.secret)
	for _, s := range []string{queue, tenant, idempotencyKey} {
		m.Write(binary.BigEndian.AppendUint64(nil, uint64(len(s))))
		m.Write([]byte(s))
	}
	var id uuid.UUID
	copy(id[:], m.Sum(nil))
	id[6] = id[6]&0x0f | 0x80 // version 8
	id[8] = id[8]&0x3f | 0x80 // RFC 9562 variant
	return id.String()
}

// tenantIDLabel starts the input of TenantID's HMAC, so that a tenant id is never the output of
// another use of the id secret (JobID's input starts with a length, never with this text).
const tenantIDLabel = "sluice tenant id v1\x00"

// TenantID returns the tenant id of key, a tenant's key parts' values as the caller joins them
// (the ingress: the queue's tenant parts; config: a weights entry): 32 lower-case hex digits of
// HMAC-SHA-256 keyed with the deployment's id secret (Options.IDSecret) over a label of its own
// and key. Every process that shares the secret derives the same id; without the secret the id
// of a known value (an API key) cannot be computed, so ids that the admin API lists or that
// job records carry do not confirm which values are tenants. Safe for concurrent use.
func (ids IDs) TenantID(key []byte) string {
	m := hmac.New(sha256.New, ids.secret)
	m.Write([]byte(tenantIDLabel))
	m.Write(key)
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// queueTag is the 16-bit tag of queue that JobID puts at the end of an unkeyed job id: FNV-1a
// over the name, folded.
func queueTag(queue string) uint16 {
	h := uint32(2166136261)
	for i := 0; i < len(queue); i++ {
		h = (h ^ uint32(queue[i])) * 16777619
	}
	return uint16(h>>16) ^ uint16(h)
}

// idTag returns the queue tag that ends id (its last four characters as hex), and false when
// they are not hex.
func idTag(id string) (uint16, bool) {
	if len(id) < 4 {
		return 0, false
	}
	t, err := strconv.ParseUint(id[len(id)-4:], 16, 16)
	return uint16(t), err == nil
}

// findable reports whether Status finds job id of queue in the queue's stream: whether id ends
// with queue's tag.
func findable(queue, id string) bool {
	t, ok := idTag(id)
	return ok && t == queueTag(queue)
}

// maxUpstreamKey is the longest Idempotency-Key UpstreamKey hands on whole: 255 characters,
// the limit the ingress accepts from a client and a common one upstream (Stripe's).
const maxUpstreamKey = 255

// UpstreamKey is the Idempotency-Key the upstream receives for a client's key of tenant, on a
// forwarded request and on every delivery of the job it became alike: the client's key as it
// is for the one tenant of a queue without tenants (tenant ""), else "<tenant id>:<key>", or
// "<tenant id>:#<SHA-256 of key, 64 hex digits>" when that would be longer than 255
// characters. Two tenants' equal keys so reach the upstream as two keys, and one client's
// retries, forwarded or deferred, as one. The tenant id is keyed ([IDs.TenantID]): the
// upstream learns which requests share a tenant, never its key. A pure function, safe for
// concurrent use.
func UpstreamKey(tenant, key string) string {
	if tenant == "" || key == "" {
		return key
	}
	if len(tenant)+1+len(key) <= maxUpstreamKey {
		return tenant + ":" + key
	}
	sum := sha256.Sum256([]byte(key))
	return tenant + ":#" + hex.EncodeToString(sum[:])
}
