package testenv

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATSDomains starts two embedded NATS servers with JetStream, each in a JetStream domain of
// its own (jetstream { domain: ... }): a hub in domain hub, and a leaf node of it in domain
// leaf, as a site that keeps streams of its own beside the hub's. It returns them once the
// leaf connection is up on both sides.
//
// A client of the leaf reaches the hub's JetStream only on the hub domain's API subjects
// ("$JS.<hub>.API.>", a context made with jetstream.NewWithDomain): nats-server lets no
// "$JS.API.>" cross a leaf connection between two domains, so a request sent there by a
// client of the leaf is answered by the leaf's own JetStream (which holds none of the hub's
// streams) or by no one. Core NATS subjects (jobs, acknowledgements, deliveries) cross it.
//
// leafOpts change the leaf's options after the domain's (its users and their permissions).
func NATSDomains(t testing.TB, hub, leaf string, leafOpts ...NATSOption) (h, l *NATSServer) {
	t.Helper()
	port := FreePort(t)
	h = NATS(t, func(o *server.Options) {
		o.ServerName, o.JetStreamDomain = "hub", hub
		o.LeafNode.Host, o.LeafNode.Port = "127.0.0.1", port
	})
	remote, err := url.Parse(fmt.Sprintf("nats-leaf://127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("testenv: leaf remote: %v", err)
	}
	l = NATS(t, append([]NATSOption{func(o *server.Options) {
		o.ServerName, o.JetStreamDomain = "leaf", leaf
		o.LeafNode.ReconnectInterval = 50 * time.Millisecond
		o.LeafNode.Remotes = []*server.RemoteLeafOpts{{URLs: []*url.URL{remote}}}
	}}, leafOpts...)...)
	WaitFor(t, 10*time.Second, "the leaf node connected to the hub", func() bool {
		return h.Server.NumLeafNodes() == 1 && l.Server.NumLeafNodes() == 1
	})
	return h, l
}
