package admin

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/sluice-rl/sluice/internal/config"
)

// The posture the Kubernetes manifests must keep (issue 41, item 8; docs/operating-security.md).

// Memory a pod of Sluice must be allowed, by the read-ahead bound of docs/operating-security.md:
// the collector's heap floor, and 2 MiB (1 MiB of a body read ahead for a cost, 1 MiB of an
// answer kept for reconciliation) for each of the requests the manifests are sized for.
const (
	heapFloor        = 64 << 20
	readAheadPerReq  = 2 << 20
	sizedForRequests = 256
	readAheadBound   = heapFloor + readAheadPerReq*sizedForRequests
	adminPort        = 9090
	monitoringNS     = "monitoring"
)

// manifests are the objects of deploy/kubernetes the posture is checked on.
type manifests struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	policies    []*networkingv1.NetworkPolicy
	config      *config.Config // the ConfigMap's sluice.yaml
}

// pinnedImage is an image named by a version tag (not latest) or a digest.
var pinnedImage = regexp.MustCompile(`^[^:@\s]+(:v?[0-9]+\.[0-9]+\.[0-9]+[0-9A-Za-z.+-]*|@sha256:[0-9a-f]{64})$`)

// posture returns what the manifests lack, one line each; none when they are safe as shipped.
func (m *manifests) posture() []string {
	var out []string
	bad := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	if len(m.deployments) == 0 {
		bad("no Deployment")
	}
	for _, d := range m.deployments {
		ps := d.Spec.Template.Spec
		if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
			bad("%s: automountServiceAccountToken: want false", d.Name)
		}
		psc := ps.SecurityContext
		if psc == nil {
			psc = &corev1.PodSecurityContext{}
		}
		for _, c := range ps.Containers {
			where := d.Name + "/" + c.Name
			sc := c.SecurityContext
			if sc == nil {
				sc = &corev1.SecurityContext{}
			}
			if !isTrue(sc.RunAsNonRoot) && !isTrue(psc.RunAsNonRoot) {
				bad("%s: runAsNonRoot: want true", where)
			}
			if !isTrue(sc.ReadOnlyRootFilesystem) {
				bad("%s: readOnlyRootFilesystem: want true", where)
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				bad("%s: allowPrivilegeEscalation: want false", where)
			}
			if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
				bad("%s: capabilities: want drop [ALL] and nothing added", where)
			}
			seccomp := sc.SeccompProfile
			if seccomp == nil {
				seccomp = psc.SeccompProfile
			}
			if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
				bad("%s: seccompProfile: want RuntimeDefault", where)
			}
			if !pinnedImage.MatchString(c.Image) {
				bad("%s: image %q: want it pinned by version or digest, not latest", where, c.Image)
			}
			m.checkEnv(where, c, bad)
			m.checkMemory(where, c, bad)
		}
	}
	m.checkAdminExposure(bad)
	return out
}

// checkEnv: the stores' URLs (credentials and all) and the admin token come from Secrets.
func (m *manifests) checkEnv(where string, c corev1.Container, bad func(string, ...any)) {
	for _, name := range []string{config.EnvRedisURL, config.EnvNATSURL, config.EnvAdminToken} {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
		if i < 0 || c.Env[i].Value != "" || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.SecretKeyRef == nil {
			bad("%s: env %s: want it from a Secret (secretKeyRef)", where, name)
		}
	}
	if m.config == nil {
		return
	}
	for _, u := range []string{redisURL(m.config), natsURL(m.config)} {
		if pu, err := url.Parse(u); err == nil && pu.User != nil {
			bad("the ConfigMap's sluice.yaml holds credentials in %s: they belong in the Secret", pu.Redacted())
		}
	}
}

// checkMemory: the memory limit is above the read-ahead bound, and GOMEMLIMIT below the limit.
func (m *manifests) checkMemory(where string, c corev1.Container, bad func(string, ...any)) {
	limit := c.Resources.Limits.Memory()
	if limit.IsZero() || limit.Value() < readAheadBound {
		bad("%s: memory limit %s: want at least the read-ahead bound, %d MiB", where, limit, readAheadBound>>20)
		return
	}
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" })
	if i < 0 {
		bad("%s: GOMEMLIMIT: want it set below the memory limit", where)
		return
	}
	gml, err := resource.ParseQuantity(strings.TrimSuffix(c.Env[i].Value, "B")) // 900MiB → 900Mi
	if err != nil || gml.Value() >= limit.Value() || gml.Value() < readAheadBound {
		bad("%s: GOMEMLIMIT %q: want between the read-ahead bound and the limit %s", where, c.Env[i].Value, limit)
	}
}

// checkAdminExposure: the admin port is on a Service of its own whose name admin_hosts lists,
// and a NetworkPolicy admits it from the monitoring namespace only.
func (m *manifests) checkAdminExposure(bad func(string, ...any)) {
	adminServices := 0
	for _, s := range m.services {
		admin, other := false, false
		for _, p := range s.Spec.Ports {
			if p.Port == adminPort || p.TargetPort.String() == "admin" || p.TargetPort.IntValue() == adminPort {
				admin = true
			} else {
				other = true
			}
		}
		switch {
		case admin && other:
			bad("Service %s: the admin port beside public ones: want it on a Service of its own", s.Name)
		case admin:
			adminServices++
			if m.config == nil || !slices.Contains(m.config.AdminHosts, s.Name) {
				bad("Service %s: its name is not in the ConfigMap's admin_hosts, so `sluice --admin http://%s:%d` gets 403", s.Name, s.Name, adminPort)
			}
			if s.Spec.Type != "" && s.Spec.Type != corev1.ServiceTypeClusterIP {
				bad("Service %s: type %s: want ClusterIP", s.Name, s.Spec.Type)
			}
		}
	}
	if adminServices == 0 {
		bad("no Service of the admin port")
	}
	guarded := false
	for _, np := range m.policies {
		if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "sluice" || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		guarded = true
		for i, r := range np.Spec.Ingress {
			if !coversPort(r.Ports, adminPort) {
				continue
			}
			if len(r.From) == 0 {
				bad("NetworkPolicy %s: ingress[%d] admits the admin port from anywhere", np.Name, i)
			}
			for _, f := range r.From {
				if f.IPBlock != nil || f.NamespaceSelector == nil || f.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != monitoringNS {
					bad("NetworkPolicy %s: ingress[%d] admits the admin port from beyond the namespace %s", np.Name, i, monitoringNS)
				}
			}
		}
	}
	if !guarded {
		bad("no NetworkPolicy of Sluice's pods")
	}
}

// coversPort reports whether a rule's ports include port (no ports: all of them).
func coversPort(ports []networkingv1.NetworkPolicyPort, port int) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if p.Port == nil || p.Port.IntValue() == port || p.Port.String() == "admin" {
			return true
		}
	}
	return false
}

func isTrue(b *bool) bool { return b != nil && *b }

func redisURL(c *config.Config) string {
	if c.Redis == nil {
		return ""
	}
	return c.Redis.URL
}

func natsURL(c *config.Config) string {
	if c.NATS == nil {
		return ""
	}
	return c.NATS.URL
}

// TestManifestPostureFailsWithoutIt: the posture check is not vacuous. Each row takes one
// field of item 8 away from the shipped manifests, and the check must name it.
func TestManifestPostureFailsWithoutIt(t *testing.T) {
	load := func() *manifests { return loadManifests(t) }
	if p := load().posture(); len(p) != 0 {
		t.Fatalf("the shipped manifests: %q", p)
	}
	first := func(m *manifests) *corev1.Container { return &m.deployments[0].Spec.Template.Spec.Containers[0] }
	for _, row := range []struct {
		name, says string
		strip      func(m *manifests)
	}{
		{"root allowed", "runAsNonRoot", func(m *manifests) {
			first(m).SecurityContext.RunAsNonRoot = nil
			m.deployments[0].Spec.Template.Spec.SecurityContext.RunAsNonRoot = nil
		}},
		{"writable root", "readOnlyRootFilesystem", func(m *manifests) { first(m).SecurityContext.ReadOnlyRootFilesystem = nil }},
		{"escalation", "allowPrivilegeEscalation", func(m *manifests) { first(m).SecurityContext.AllowPrivilegeEscalation = nil }},
		{"capabilities kept", "capabilities", func(m *manifests) { first(m).SecurityContext.Capabilities = nil }},
		{"no seccomp", "seccompProfile", func(m *manifests) {
			first(m).SecurityContext.SeccompProfile = nil
			m.deployments[0].Spec.Template.Spec.SecurityContext.SeccompProfile = nil
		}},
		{"service account token", "automountServiceAccountToken", func(m *manifests) { m.deployments[0].Spec.Template.Spec.AutomountServiceAccountToken = nil }},
		{"latest", "pinned", func(m *manifests) { first(m).Image = "ghcr.io/sluice-rl/sluice:latest" }},
		{"redis url in the clear", config.EnvRedisURL, func(m *manifests) {
			for i, e := range first(m).Env {
				if e.Name == config.EnvRedisURL {
					first(m).Env[i] = corev1.EnvVar{Name: e.Name, Value: "redis://:pw@redis:6379"}
				}
			}
		}},
		{"credentials in the ConfigMap", "holds credentials", func(m *manifests) { m.config.NATS.URL = "nats://u:pw@nats:4222" }},
		{"memory below the bound", "read-ahead bound", func(m *manifests) {
			first(m).Resources.Limits[corev1.ResourceMemory] = resource.MustParse("512Mi")
		}},
		{"admin on the public Service", "Service of its own", func(m *manifests) {
			for _, s := range m.services {
				if s.Name == "sluice" {
					s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "admin", Port: adminPort})
				}
			}
		}},
		{"admin_hosts unset", "admin_hosts", func(m *manifests) { m.config.AdminHosts = nil }},
		{"no NetworkPolicy", "NetworkPolicy", func(m *manifests) { m.policies = nil }},
		{"admin open to all", "from anywhere", func(m *manifests) {
			for i := range m.policies[0].Spec.Ingress {
				m.policies[0].Spec.Ingress[i].From = nil
			}
		}},
	} {
		m := load()
		row.strip(m)
		p := strings.Join(m.posture(), "\n")
		if !strings.Contains(p, row.says) {
			t.Errorf("%s: the check says %q, want it to name %s", row.name, p, row.says)
		}
	}
}

// loadManifests reads deploy/kubernetes as TestKubernetesManifests does, into manifests.
func loadManifests(t *testing.T) *manifests {
	t.Helper()
	files, err := filepath.Glob("../../deploy/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	m := &manifests{}
	for _, f := range files {
		obj := decodeManifest(t, f)
		switch o := obj.(type) {
		case *appsv1.Deployment:
			m.deployments = append(m.deployments, o)
		case *corev1.Service:
			m.services = append(m.services, o)
		case *networkingv1.NetworkPolicy:
			m.policies = append(m.policies, o)
		case *corev1.ConfigMap:
			env := map[string]string{config.EnvAdminToken: "0123456789abcdef0123456789abcdef"}
			cfg, err := config.Parse(f, []byte(o.Data["sluice.yaml"]), func(k string) string { return env[k] })
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			m.config = cfg
		}
	}
	return m
}

// decodeManifest decodes the manifest in file f strictly into its k8s.io/api type; nil for
// kinds the posture does not check.
func decodeManifest(t *testing.T, f string) any {
	t.Helper()
	raw, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	var head struct{ APIVersion, Kind string }
	if err := yaml.Unmarshal(raw, &head); err != nil {
		t.Fatalf("%s: %v", f, err)
	}
	var obj any
	switch head.APIVersion + " " + head.Kind {
	case "apps/v1 Deployment":
		obj = &appsv1.Deployment{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "networking.k8s.io/v1 NetworkPolicy":
		obj = &networkingv1.NetworkPolicy{}
	case "v1 ConfigMap":
		obj = &corev1.ConfigMap{}
	default:
		return nil
	}
	if err := yaml.UnmarshalStrict(raw, obj); err != nil {
		t.Fatalf("%s: %v", f, err)
	}
	return obj
}
