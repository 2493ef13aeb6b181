package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// TestCheckThroughDomain: `sluice check` against a leaf node whose own JetStream is in domain
// leaf, with nats.jetstream_domain: hub, probes and reaches the hub's JetStream: a user granted
// queue.PermissionsFor that domain passes and the output names domain hub; a user granted
// queue.PermissionsFix (the default API subjects) fails naming "$JS.hub.API.INFO" and the
// domain's fix; without the key, the check reaches the leaf's own JetStream and says so.
func TestCheckThroughDomain(t *testing.T) {
	js, err := connect.JetStream(testenv.Connect(t, testenv.NATS(t).URL), "hub")
	if err != nil {
		t.Fatal(err)
	}
	fix := queue.PermissionsFor(js)
	dir := t.TempDir()
	conf := filepath.Join(dir, "leaf.conf")
	if err := os.WriteFile(conf, []byte(`authorization { users = [
  { user: admin, password: admin }
  { user: plain, password: p, `+queue.PermissionsFix+` }
  { user: domain, password: p, `+fix+` }
] }
no_auth_user: admin
`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, leaf := testenv.NATSDomains(t, "hub", "leaf", func(o *server.Options) {
		if err := o.ProcessConfigFile(conf); err != nil {
			t.Fatalf("the leaf's users: %v", err)
		}
	})
	for _, tc := range []struct {
		user, domain string
		code         int
		out, err     string
	}{
		{"domain", "hub", 0, `nats: ok: JetStream in domain "hub", the user's permissions`, ""},
		{"plain", "hub", 1, "", `refused Publish to "$JS.hub.API.INFO"; Sluice needs publish on $JS.hub.API.> ` +
			`(streams, consumers, key-value buckets and their entries), $JS.ACK.> (acks) and SLUICE.> (jobs): grant the user ` + fix},
		{"admin", "", 0, `nats: ok: JetStream in domain "leaf"`, ""},
	} {
		url := strings.Replace(leaf.URL, "nats://", "nats://"+tc.user+":p@", 1)
		key := ""
		if tc.domain != "" {
			key = ", jetstream_domain: " + tc.domain
		}
		if tc.user == "admin" {
			url = leaf.URL // no_auth_user
		}
		file := filepath.Join(dir, tc.user+".yaml")
		body := fmt.Sprintf("nats: {url: %q%s}\nqueues: [{name: q, rate: 5/s, target: \"http://127.0.0.1:1/x\"}]\n", url, key)
		if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"check", "-config", file}, func(string) string { return "" }, &out, &errOut)
		if code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errOut.String(), tc.err) {
			t.Errorf("sluice check as %s, domain %q: exit %d (want %d)\nstdout: %s\nstderr: %s", tc.user, tc.domain, code, tc.code, out.String(), errOut.String())
		}
		t.Logf("sluice check as %s, domain %q:\n%s\n%s", tc.user, tc.domain, strings.TrimSpace(out.String()), strings.TrimSpace(errOut.String()))
	}
}

// TestCheckThroughLeafWithoutJetStream: through a leaf node without JetStream of its own,
// "$JS.API.>" does not cross to a hub in a domain either: `sluice check` without
// nats.jetstream_domain fails saying that JetStream does not answer and naming the key, and
// passes with it.
func TestCheckThroughLeafWithoutJetStream(t *testing.T) {
	_, leaf := testenv.NATSDomains(t, "hub", "leaf", func(o *server.Options) {
		o.JetStream, o.JetStreamDomain = false, ""
	})
	dir := t.TempDir()
	for _, tc := range []struct {
		key      string
		code     int
		out, err string
	}{
		{"", 1, "", "nats: JetStream does not answer (is the server started with -js? behind a leaf node, set nats.jetstream_domain"},
		{", jetstream_domain: hub", 0, `nats: ok: JetStream in domain "hub"`, ""},
	} {
		file := filepath.Join(dir, "sluice.yaml")
		body := fmt.Sprintf("nats: {url: %q%s}\nqueues: [{name: q, rate: 5/s, target: \"http://127.0.0.1:1/x\"}]\n", leaf.URL, tc.key)
		if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"check", "-config", file}, func(string) string { return "" }, &out, &errOut)
		if code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errOut.String(), tc.err) {
			t.Errorf("sluice check through a leaf without JetStream, nats {%s}: exit %d (want %d)\nstdout: %s\nstderr: %s",
				tc.key, code, tc.code, out.String(), errOut.String())
		}
		t.Logf("nats {%s}: exit %d\n%s\n%s", tc.key, code, strings.TrimSpace(out.String()), strings.TrimSpace(errOut.String()))
	}
}
