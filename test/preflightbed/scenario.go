// Package preflightbed is the scenario of the PreflightValidation tests, shared by the controller's
// envtest (this package's test) and the kubectl-kmm plugin's: two in-process registries (one
// public, one behind basic auth), a canary node already on the target kernel, pull secrets, and
// five Modules — one served, one without a mapping for the kernel, one whose image is missing, one
// on the private registry with the right secret and one with a wrong secret — with the reason
// each must get, and checkers that say what differs.
package preflightbed

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
	"github.com/kmm-project/kmm/preflight"
	"github.com/kmm-project/kmm/test/ocireg"
)

// Kernels: the nodes run Current; the upgrade brings Target, which the canary node already runs.
const (
	Current = "6.1.0-56-cloud-amd64"
	Target  = "6.1.0-60-cloud-amd64"
)

// Scenario is what Setup created.
type Scenario struct {
	NS     string
	Canary string
	Public *ocireg.Registry
	// Want is the reason each Module (namespace/name) must get for Target.
	Want map[string]string
}

// Setup creates the namespace ns, the canary node, the pull secrets and the five Modules, with
// their images pushed where they should exist.
func Setup(ctx context.Context, t *testing.T, c client.Client, ns string) *Scenario {
	t.Helper()
	public := ocireg.Start(t, ocireg.Options{})
	private := ocireg.Start(t, ocireg.Options{User: "kmm", Password: "s3cret"})
	public.Push(t, "kmod/served:"+Target)
	private.Push(t, "kmod/private:"+Target)
	s := &Scenario{NS: ns, Canary: ns + "-canary", Public: public, Want: map[string]string{
		ns + "/served":        kmmv1beta1.PreflightReasonSuccess,
		ns + "/nomapping":     kmmv1beta1.PreflightReasonNoMapping,
		ns + "/missing":       kmmv1beta1.PreflightReasonImageMissing,
		ns + "/private-right": kmmv1beta1.PreflightReasonSuccess,
		ns + "/private-wrong": kmmv1beta1.PreflightReasonUnauthorized,
	}}
	create := func(obj client.Object) {
		t.Helper()
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
		}
	}
	create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	s.createCanary(ctx, t, c)
	for name, pass := range map[string]string{"right": "s3cret", "wrong": "not-the-password"} {
		create(&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Type:       corev1.SecretTypeDockerConfigJson,
			Data:       map[string][]byte{corev1.DockerConfigJsonKey: private.DockerConfigJSON("kmm", pass)},
		})
	}
	create(s.module("served", `^6\.1\.0-`, public.Host+"/kmod/served:$KERNEL_FULL_VERSION", ""))
	create(s.module("nomapping", `^5\.14\.`, public.Host+"/kmod/served:$KERNEL_FULL_VERSION", ""))
	create(s.module("missing", `^6\.1\.0-`, public.Host+"/kmod/missing:$KERNEL_FULL_VERSION", ""))
	create(s.module("private-right", `^6\.1\.0-`, private.Host+"/kmod/private:$KERNEL_FULL_VERSION", "right"))
	create(s.module("private-wrong", `^6\.1\.0-`, private.Host+"/kmod/private:$KERNEL_FULL_VERSION", "wrong"))
	return s
}

// createCanary creates the node that already runs Target (selected by none of the Modules, so
// that the operator schedules nothing there).
func (s *Scenario) createCanary(ctx context.Context, t *testing.T, c client.Client) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.Canary, Labels: map[string]string{"canary": s.NS}}}
	if err := c.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	n.Status.NodeInfo = corev1.NodeSystemInfo{KernelVersion: Target, OperatingSystem: "linux", Architecture: "amd64"}
	if err := c.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// module is a Module of the scenario: one regexp mapping to image, on plain HTTP (registryTLS
// insecure), with an optional pull secret; it selects no node.
func (s *Scenario) module(name, regexp, image, secret string) *kmmv1beta1.Module {
	m := &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.NS, Name: name},
		Spec: kmmv1beta1.ModuleSpec{
			Selector: map[string]string{"kmm-preflight-test": s.NS},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: strings.ReplaceAll(name, "-", "_")},
				RegistryTLS:    kmmv1beta1.TLSOptions{Insecure: true},
				KernelMappings: []kmmv1beta1.KernelMapping{{Regexp: regexp, ContainerImage: image}},
			}},
		},
	}
	if secret != "" {
		m.Spec.ImageRepoSecret = &corev1.LocalObjectReference{Name: secret}
	}
	return m
}

// Mine keeps the verdicts of the scenario's namespace (a PreflightValidation covers every Module of
// the cluster).
func (s *Scenario) Mine(vs []preflight.Verdict) []preflight.Verdict {
	var out []preflight.Verdict
	for _, v := range vs {
		if v.Namespace == s.NS {
			out = append(out, v)
		}
	}
	return out
}

// CheckVerdicts lists what differs between the verdicts of the scenario's Modules and Want: a
// Module missing or extra, a wrong reason, verified not matching the reason, a final verdict
// expected final, a failure without a message, a Success without its image.
func (s *Scenario) CheckVerdicts(vs []preflight.Verdict) []string {
	var problems []string
	seen := map[string]bool{}
	for _, v := range s.Mine(vs) {
		seen[v.Key()] = true
		want, ok := s.Want[v.Key()]
		switch {
		case !ok:
			problems = append(problems, v.Key()+": not a Module of the scenario")
		case v.Reason != want:
			problems = append(problems, fmt.Sprintf("%s: reason %s, want %s (%s)", v.Key(), v.Reason, want, v.Message))
		case v.Verified != (want == kmmv1beta1.PreflightReasonSuccess):
			problems = append(problems, fmt.Sprintf("%s: verified %v with reason %s", v.Key(), v.Verified, v.Reason))
		case !v.Final:
			problems = append(problems, v.Key()+": not final (to be retried)")
		case v.Message == "" || (v.Verified && !strings.Contains(v.Image, "/kmod/")):
			problems = append(problems, fmt.Sprintf("%s: message %q, image %q", v.Key(), v.Message, v.Image))
		}
	}
	for k := range s.Want {
		if !seen[k] {
			problems = append(problems, k+": no verdict")
		}
	}
	sort.Strings(problems)
	return problems
}

// CheckStatus lists what differs between a PreflightValidation's status and Want, entry by entry
// (through CheckVerdicts), and what is wrong with the upstream fields themselves.
func (s *Scenario) CheckStatus(pv *kmmv1beta2.PreflightValidation) []string {
	var vs []preflight.Verdict
	var problems []string
	for _, e := range pv.Status.Modules {
		vs = append(vs, preflight.VerdictOf(e))
		if e.Namespace == s.NS && (e.LastTransitionTime.IsZero() || e.StatusReason == "") {
			problems = append(problems, fmt.Sprintf("%s/%s: lastTransitionTime %v, statusReason %q", e.Namespace, e.Name, e.LastTransitionTime, e.StatusReason))
		}
	}
	if pv.Status.ObservedGeneration != pv.Generation {
		problems = append(problems, fmt.Sprintf("observedGeneration %d, generation %d", pv.Status.ObservedGeneration, pv.Generation))
	}
	return append(problems, s.CheckVerdicts(vs)...)
}

// CheckTable lists what the table of `kubectl kmm preflight` gets wrong about the scenario: each
// Module's row must carry its VerificationStatus word and its reason.
func CheckTable(s *Scenario, table string) []string {
	rows := map[string][]string{}
	for _, line := range strings.Split(table, "\n") {
		if f := strings.Fields(line); len(f) >= 3 {
			rows[f[0]] = f
		}
	}
	var problems []string
	for k, want := range s.Want {
		status := kmmv1beta2.VerificationFailure
		if want == kmmv1beta1.PreflightReasonSuccess {
			status = kmmv1beta2.VerificationSuccess
		}
		if f, ok := rows[k]; !ok || f[1] != status || f[2] != want {
			problems = append(problems, fmt.Sprintf("%s: row %v, want %s %s", k, rows[k], status, want))
		}
	}
	sort.Strings(problems)
	return problems
}

// MissingEvents lists the reasons of which no Warning Event regards the PreflightValidation pvName.
func MissingEvents(evs []eventsv1.Event, pvName string, reasons ...string) []string {
	seen := map[string]bool{}
	for _, e := range evs {
		if e.Regarding.Kind == "PreflightValidation" && e.Regarding.Name == pvName && e.Type == corev1.EventTypeWarning {
			seen[e.Reason] = true
		}
	}
	var missing []string
	for _, r := range reasons {
		if !seen[r] {
			missing = append(missing, r)
		}
	}
	return missing
}
