package testenv

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

// ProxyLeaks are goleak options for a package whose tests run a Supercluster: Toxiproxy's
// latency toxic sends a chunk it delayed to its link's writer without a way out, so when a
// link's far end closes with a chunk in flight (a cut, the end of a test) that goroutine and
// its link's reader stay blocked for the life of the test binary. Nothing of Sluice's is.
func ProxyLeaks() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).write"),
	}
}

// Supercluster is several "regions" on loopback, as NATS runs them across data centres: each
// region its own NATS cluster (one embedded server with JetStream, the cluster named after the
// region), the clusters joined by gateways into one supercluster. Every gateway link goes
// through an in-process Toxiproxy: the link into a region is one proxy that each other
// region's gateway dials (the region's server advertises the proxy's address as its gateway
// URL, so a reconnect cannot go around it), with Latency added in each direction. Cut
// disables the proxies (connections reset, dials refused); Heal enables them again.
//
// JetStream spans the supercluster: one meta group over every region's server, each stream
// placed in one cluster (by default the one whose server the request came in on; a
// placement names another). A client of one region reaches a stream of another through its
// own server and the gateway. With two regions the meta group has no quorum while they are
// cut apart: streams that exist keep working (publishes, reads, consumers) but none can be
// made. Cost: one embedded server and one proxy per region.
type Supercluster struct {
	// Names are the regions, in the order given; the first is the home region.
	Names []string
	// Latency is what each gateway link adds in each direction.
	Latency time.Duration

	// HomeProc is the home region's server when it runs as a nats-server process
	// (NewSuperclusterHomeProc), for tests that SIGKILL and restart it; nil otherwise.
	HomeProc *NATSProcess

	t       testing.TB
	servers map[string]*server.Server // the embedded servers
	urls    map[string]string
	links   map[string]*toxiproxy.Proxy // the link into each region
	mu      sync.Mutex
}

// NewSupercluster starts one region per name (at least two), each a one-server JetStream cluster
// named after it, joined by gateways through proxies that add latency each way, and waits
// until every gateway is up and JetStream answers in every region. The test's cleanup stops it.
func NewSupercluster(t testing.TB, latency time.Duration, names ...string) *Supercluster {
	t.Helper()
	return newSupercluster(t, latency, false, names)
}

// NewSuperclusterHomeProc is NewSupercluster with the home region (the first) a nats-server
// process (HomeProc) with its store in a directory of its own, which a test can SIGKILL and
// start again on its store and ports, as a region's server that crashed.
func NewSuperclusterHomeProc(t testing.TB, latency time.Duration, names ...string) *Supercluster {
	t.Helper()
	return newSupercluster(t, latency, true, names)
}

func newSupercluster(t testing.TB, latency time.Duration, homeProc bool, names []string) *Supercluster {
	t.Helper()
	if len(names) < 2 {
		t.Fatalf("testenv: a supercluster needs two regions or more, got %v", names)
	}
	sc := &Supercluster{Names: names, Latency: latency, t: t, servers: map[string]*server.Server{},
		urls: map[string]string{}, links: map[string]*toxiproxy.Proxy{}}
	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	gwPort, linkAddr := map[string]int{}, map[string]string{}
	for _, n := range names {
		gwPort[n] = FreePort(t)
		linkAddr[n] = fmt.Sprintf("127.0.0.1:%d", FreePort(t))
	}
	for _, n := range names {
		p := toxiproxy.NewProxy(api, "into-"+n, linkAddr[n], fmt.Sprintf("127.0.0.1:%d", gwPort[n]))
		if err := p.Start(); err != nil {
			t.Fatalf("testenv: gateway link into %s: %v", n, err)
		}
		t.Cleanup(p.Stop)
		for _, dir := range []string{"upstream", "downstream"} {
			toxic := fmt.Sprintf(`{"name":"latency_%s","type":"latency","stream":%q,"attributes":{"latency":%d}}`,
				dir, dir, latency.Milliseconds())
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
				t.Fatalf("testenv: latency on the link into %s: %v", n, err)
			}
		}
		sc.links[n] = p
	}
	for _, n := range names {
		var remotes []*server.RemoteGatewayOpts
		for _, o := range names {
			if o != n {
				u, _ := url.Parse("nats://" + linkAddr[o])
				remotes = append(remotes, &server.RemoteGatewayOpts{Name: o, URLs: []*url.URL{u}})
			}
		}
		// JetStream clustering wants a configured route; a one-server cluster's is to itself,
		// which the server recognises and drops.
		routePort := FreePort(t)
		self, _ := url.Parse(fmt.Sprintf("nats://127.0.0.1:%d", routePort))
		if homeProc && n == names[0] {
			sc.HomeProc = startRegionProc(t, n, routePort, gwPort[n], linkAddr[n], remotes)
			sc.urls[n] = sc.HomeProc.URL
			continue
		}
		o := &server.Options{
			ServerName: "sluice-" + n, Host: "127.0.0.1", Port: server.RANDOM_PORT,
			JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true, JetStreamMaxStore: 1 << 40,
			Cluster: server.ClusterOpts{Name: n, Host: "127.0.0.1", Port: routePort},
			Routes:  []*url.URL{self},
			Gateway: server.GatewayOpts{Name: n, Host: "127.0.0.1", Port: gwPort[n], Advertise: linkAddr[n],
				Gateways: remotes},
		}
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatalf("testenv: nats server of region %s: %v", n, err)
		}
		go s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		sc.servers[n] = s
	}
	for n, s := range sc.servers { // each server's start waits for its peers' JetStream
		if !s.ReadyForConnections(30 * time.Second) {
			t.Fatalf("testenv: nats server of region %s not ready", n)
		}
		sc.urls[n] = s.ClientURL()
	}
	sc.waitGateways(30 * time.Second)
	for _, n := range names {
		nc, err := nats.Connect(sc.URL(n))
		if err != nil {
			t.Fatalf("testenv: connect to region %s: %v", n, err)
		}
		WaitFor(t, 60*time.Second, "JetStream to answer in region "+n, func() bool {
			js, err := nc.JetStream(nats.MaxWait(2 * time.Second))
			if err != nil {
				return false
			}
			_, err = js.AccountInfo()
			return err == nil
		})
		nc.Close()
	}
	return sc
}

// URL is the client URL of region's server: what the region's processes connect to, for their
// queues and, through the gateways, for a coordinator in another region.
func (sc *Supercluster) URL(region string) string { return sc.urls[region] }

// startRegionProc starts region n's server as a nats-server process: a one-server cluster (a
// route to itself) whose gateway listens on gwPort, advertises link and dials remotes.
func startRegionProc(t testing.TB, n string, routePort, gwPort int, link string, remotes []*server.RemoteGatewayOpts) *NATSProcess {
	t.Helper()
	bin, err := natsServerBinary()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	var gws []string
	for _, r := range remotes {
		gws = append(gws, fmt.Sprintf("{name: %q, url: %q}", r.Name, r.URLs[0].String()))
	}
	conf := fmt.Sprintf("server_name: %q\ncluster {name: %q, listen: \"127.0.0.1:%d\", routes: [\"nats://127.0.0.1:%d\"]}\n"+
		"gateway {name: %q, listen: \"127.0.0.1:%d\", advertise: %q, gateways: [%s]}\n",
		"sluice-"+n, n, routePort, routePort, n, gwPort, link, strings.Join(gws, ", "))
	dir := t.TempDir()
	path := filepath.Join(dir, "region.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	p := &NATSProcess{t: t, bin: bin, dir: filepath.Join(dir, "store"), port: FreePort(t), Name: "sluice-" + n,
		extra: []string{"-c", path}}
	if err := p.start(); err != nil {
		t.Fatalf("testenv: start nats-server of region %s: %v", n, err)
	}
	p.URL = fmt.Sprintf("nats://127.0.0.1:%d", p.port)
	t.Cleanup(p.Kill)
	return p
}

// waitGateways waits until every server has an outbound gateway to each other region (each
// server dials every other, so that is every link both ways).
func (sc *Supercluster) waitGateways(timeout time.Duration) {
	sc.t.Helper()
	want := len(sc.Names) - 1
	WaitFor(sc.t, timeout, "the gateways between every two regions", func() bool {
		for _, s := range sc.servers {
			if s.NumOutboundGateways() < want {
				return false
			}
		}
		return true
	})
}

// Cut disables every gateway link: open connections are closed and new ones refused, so no
// message crosses between regions until Heal. It returns when the cut began.
func (sc *Supercluster) Cut() time.Time {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	at := time.Now()
	for _, p := range sc.links {
		p.Stop()
	}
	return at
}

// Heal enables every gateway link again and returns when it did; the servers redial their
// gateways within about a second (nats-server's reconnect delay), which WaitHealed waits for.
func (sc *Supercluster) Heal() time.Time {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, n := range sc.Names {
		if err := sc.links[n].Start(); err != nil {
			sc.t.Fatalf("testenv: heal the link into %s: %v", n, err)
		}
	}
	return time.Now()
}

// WaitHealed waits until the gateways between every two regions are up again after Heal.
func (sc *Supercluster) WaitHealed(timeout time.Duration) { sc.t.Helper(); sc.waitGateways(timeout) }
