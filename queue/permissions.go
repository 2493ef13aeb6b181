package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrPermission is returned by CheckPermissions when the NATS user may not publish to, or
// subscribe to, a subject Sluice uses: retrying cannot mend it, the server's authorization must.
var ErrPermission = errors.New("queue: the NATS user lacks a permission Sluice needs")

// PermissionsFix is what an operator grants a NATS user for Sluice (with the default prefix)
// that reaches JetStream on its default API subjects ($JS.API.), as nats-server's
// authorization block writes it. PermissionsFor says it for another JetStream context.
const PermissionsFix = `permissions: { publish: ["$JS.API.>", "$JS.ACK.>", "$KV.>", "SLUICE.>"], subscribe: ["_INBOX.>", "SLUICE.>", "$JS.EVENT.ADVISORY.CONSUMER.>"] }`

// PermissionsFor is PermissionsFix for a user that reaches JetStream through js: on a domain's
// API subjects ("$JS.<domain>.API.>", a context made with jetstream.NewWithDomain, as a client
// of a leaf node does) or under the prefix js was made with (jetstream.NewWithAPIPrefix):
// those replace "$JS.API.>", and "$KV.>" too, as nats.go writes a key-value bucket's entries
// under the API prefix then. For a context on the default subjects it is PermissionsFix.
func PermissionsFor(js jetstream.JetStream) string { return permissionsFix(APIPrefix(js)) }

// permissionsFix is PermissionsFor a context whose API subjects start with api.
func permissionsFix(api string) string {
	pub := `"` + api + `>", "$JS.ACK.>", `
	if api == jetstream.DefaultAPIPrefix {
		pub += `"$KV.>", `
	}
	return `permissions: { publish: [` + pub + `"SLUICE.>"], subscribe: ["_INBOX.>", "SLUICE.>", "$JS.EVENT.ADVISORY.CONSUMER.>"] }`
}

// kvPutPrefix is where nats.go writes the entries of key-value bucket bucket through a
// context whose API subjects start with api: "$KV.<bucket>." on the default ones, else under
// api (nats.go's kv useJSPfx).
func kvPutPrefix(api, bucket string) string {
	if api == jetstream.DefaultAPIPrefix {
		return "$KV." + bucket + "."
	}
	return api + "$KV." + bucket + "."
}

// probeTimeout bounds CheckPermissions's wait for the server when ctx has no deadline.
const probeTimeout = 5 * time.Second

// probeSeq is the last sequence a probe tells JetStream to expect: no stream has it, so a probe
// that may publish is refused by the stream (wrong last sequence) and stores nothing.
const probeSeq = "1000000000000000000"

// CheckPermissions asks the NATS server, without changing anything, whether the user of js's
// connection may do what Sluice does through js with the queues named (default prefix):
// publish to JetStream's API on js's API subjects (APIPrefix: "$JS.API.", a domain's, or a
// prefix) for their streams and the status bucket, to their subjects and the status bucket's
// (a message each that JetStream refuses, as it expects a last sequence no stream has), to the
// ack subjects of their streams; and subscribe to a reply inbox, the cancellations' subject
// and the consumer advisories Sluice watches. Each is one message, sent without a reply
// subject; one flush then waits for the server to have judged them all: nats-server answers a
// subject the user may not use with a permissions violation before it answers the flush. It
// returns an error wrapping ErrPermission that names the most basic subject refused and the
// fix (PermissionsFor js), the flush's error when the server does not answer within ctx (5s
// when ctx has no deadline), or nil.
//
// A violation the connection saw before the call counts too: it is as permanent.
func CheckPermissions(ctx context.Context, js jetstream.JetStream, queues []string) error {
	nc, api := js.Conn(), APIPrefix(js)
	q := &core{opts: Options{Prefix: DefaultPrefix}}
	// The connection keeps the last violation only: the probes go from the most particular to
	// the most basic, so that the error names the most basic permission missing.
	for _, s := range []string{q.cancelSubject(), leaderElected, moverCreated, nc.NewInbox()} {
		sub, err := nc.SubscribeSync(s)
		if err != nil {
			return fmt.Errorf("queue: permission probe %s: %w", s, err)
		}
		defer sub.Unsubscribe()
	}
	status := q.bucketName()
	expect := []string{kvPutPrefix(api, status) + "permission-probe"}
	var acks, apis []string
	for _, name := range queues {
		st := q.streamName(name)
		expect = append(expect, q.jobSubject(name, "permission-probe"))
		acks = append(acks, "$JS.ACK."+st+".permission-probe")
		apis = append(apis, api+"STREAM.CREATE."+st, api+"STREAM.INFO."+st)
	}
	for _, s := range expect {
		m := nats.NewMsg(s)
		m.Header.Set("Nats-Expected-Last-Sequence", probeSeq)
		if err := nc.PublishMsg(m); err != nil {
			return fmt.Errorf("queue: permission probe %s: %w", s, err)
		}
	}
	apis = append(apis, api+"STREAM.CREATE.KV_"+status, api+"STREAM.INFO.KV_"+status, api+"INFO")
	for _, s := range append(acks, apis...) {
		if err := nc.Publish(s, nil); err != nil {
			return fmt.Errorf("queue: permission probe %s: %w", s, err)
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, probeTimeout)
		defer cancel()
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("queue: permission probe: the NATS server did not answer: %w", err)
	}
	if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) {
		return permissionError(err, api)
	}
	return nil
}

// permissionError explains a permissions violation: what was refused, and the fix for a
// context whose API subjects start with api.
func permissionError(err error, api string) error {
	what := err.Error()
	if i := strings.Index(what, "Permissions Violation for "); i >= 0 {
		what = what[i+len("Permissions Violation for "):]
	}
	need := "publish on " + api + "> (streams, consumers and key-value buckets), $JS.ACK.> (acks), $KV.> and SLUICE.> (jobs and their status)"
	if api != jetstream.DefaultAPIPrefix {
		need = "publish on " + api + "> (streams, consumers, key-value buckets and their entries), $JS.ACK.> (acks) and SLUICE.> (jobs)"
	}
	if strings.HasPrefix(what, "Subscription") {
		need = "subscribe on _INBOX.> (the replies of JetStream's API and of pulls), SLUICE.> (cancellations) and " +
			"$JS.EVENT.ADVISORY.CONSUMER.> (consumer leaders and schedules)"
	}
	return fmt.Errorf("%w: the server refused %s; Sluice needs %s: grant the user %s in nats-server's authorization",
		ErrPermission, strings.Trim(what, "' "), need, permissionsFix(api))
}
