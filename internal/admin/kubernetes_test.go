package admin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/sluice-rl/sluice/internal/config"
)

// scaledObject is the part of KEDA's ScaledObject (keda.sh/v1alpha1) the manifests use.
type scaledObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		ScaleTargetRef struct {
			Name string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount *int32 `json:"minReplicaCount"`
		MaxReplicaCount *int32 `json:"maxReplicaCount"`
		PollingInterval *int32 `json:"pollingInterval"`
		CooldownPeriod  *int32 `json:"cooldownPeriod"`
		Triggers        []struct {
			Type     string            `json:"type"`
			Metadata map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

// TestKubernetesManifests: every manifest of deploy/kubernetes decodes strictly (an unknown or
// misspelt field fails) into its k8s.io/api type, or, for KEDA's ScaledObject, into a struct
// of its shape; the Deployments probe /healthz and /readyz on the admin port and set
// resources, each has a PodDisruptionBudget, the ScaledObject scales the worker Deployment on
// sluice_queue_desired_workers, and the ConfigMap's sluice.yaml loads with internal/config.
// (kubeconform would need its schemas from the network, which CI has not.)
func TestKubernetesManifests(t *testing.T) {
	files, err := filepath.Glob("../../deploy/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	deployments := map[string]*appsv1.Deployment{}
	pdbs := map[string]*policyv1.PodDisruptionBudget{}
	var scaled []scaledObject
	var m manifests
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var head struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal(raw, &head); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		strict := func(v any) {
			if err := yaml.UnmarshalStrict(raw, v); err != nil {
				t.Errorf("%s: %v", f, err)
			}
		}
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			var d appsv1.Deployment
			strict(&d)
			deployments[d.Name] = &d
			m.deployments = append(m.deployments, &d)
		case "v1 Service":
			var s corev1.Service
			strict(&s)
			m.services = append(m.services, &s)
		case "networking.k8s.io/v1 NetworkPolicy":
			var np networkingv1.NetworkPolicy
			strict(&np)
			m.policies = append(m.policies, &np)
		case "v1 ConfigMap":
			var cm corev1.ConfigMap
			strict(&cm)
			env := map[string]string{config.EnvAdminToken: "0123456789abcdef0123456789abcdef"}
			cfg, err := config.Parse(f+": sluice.yaml", []byte(cm.Data["sluice.yaml"]), func(k string) string { return env[k] })
			if err != nil {
				t.Errorf("the ConfigMap's sluice.yaml: %v", err)
			}
			m.config = cfg
		case "policy/v1 PodDisruptionBudget":
			var p policyv1.PodDisruptionBudget
			strict(&p)
			pdbs[p.Spec.Selector.MatchLabels["app.kubernetes.io/component"]] = &p
		case "keda.sh/v1alpha1 ScaledObject":
			var so scaledObject
			strict(&so)
			scaled = append(scaled, so)
		default:
			t.Errorf("%s: unexpected %s %s", f, head.APIVersion, head.Kind)
		}
	}
	for _, name := range []string{"sluice-ingress", "sluice-worker"} {
		d := deployments[name]
		if d == nil {
			t.Errorf("no Deployment %s", name)
			continue
		}
		c := d.Spec.Template.Spec.Containers[0]
		if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.LivenessProbe.HTTPGet.Port.String() != "admin" ||
			c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
			t.Errorf("%s: probes %+v %+v", name, c.LivenessProbe, c.ReadinessProbe)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: resources %+v", name, c.Resources)
		}
		if pdbs[d.Spec.Selector.MatchLabels["app.kubernetes.io/component"]] == nil {
			t.Errorf("%s: no PodDisruptionBudget selects it", name)
		}
	}
	for _, p := range m.posture() {
		t.Error(p)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict([]byte("apiVersion: apps/v1\nkind: Deployment\nspec: { replicaz: 2 }\n"), &d); err == nil {
		t.Error("strict decoding let a misspelt field through")
	}
	if len(scaled) != 1 {
		t.Fatalf("%d ScaledObjects, want 1", len(scaled))
	}
	so := scaled[0]
	if so.Spec.ScaleTargetRef.Name != "sluice-worker" || len(so.Spec.Triggers) != 1 || so.Spec.Triggers[0].Type != "prometheus" ||
		!strings.Contains(so.Spec.Triggers[0].Metadata["query"], "sluice_queue_desired_workers") ||
		so.Spec.Triggers[0].Metadata["serverAddress"] == "" || so.Spec.Triggers[0].Metadata["threshold"] == "" {
		t.Errorf("ScaledObject: %+v", so)
	}
}
