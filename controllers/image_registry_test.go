package controllers_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/image"
	"github.com/kmm-project/kmm/test/ocireg"
	"github.com/kmm-project/kmm/test/testbed"
)

// modulePath is where recipeModule's filesToSign expects the module of name.
func modulePath(name string) string {
	return "/opt/lib/modules/" + testbed.KernelA + "/" + name + ".ko"
}

// startRealImageKubelet is startImageKubelet running the pods as their containers would.
func startRealImageKubelet(t *testing.T, reg *ocireg.Registry, ns string, modules ...string) *imageKubelet {
	k := startImageKubelet(t, reg, ns)
	k.set(func(k *imageKubelet) {
		k.real = true
		for _, m := range modules {
			k.modulePaths = append(k.modulePaths, modulePath(m))
		}
	})
	return k
}

// TestImagePodsAndCheckHonourTheRegistrySettings: the registry serves TLS with a private CA that
// only the operator's CA bundle ConfigMap holds (the worker's --worker-ca-bundle-configmap), and
// asks for basic auth that only the Module's imageRepoSecret has. The image controller's check, the
// build pod's push and the sign pod's pull and push all get through: the image is built, signed
// and loads. Without the settings the check fails on the certificate (x509) and nothing is built.
func TestImagePodsAndCheckHonourTheRegistrySettings(t *testing.T) {
	cluster.StartOperatorWith(t, func(o *app.Options) { o.WorkerRegistry.CABundleConfigMap = "registry-ca" })
	reg := ocireg.Start(t, ocireg.Options{TLS: true, User: "robot", Password: "s3cret"})
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	k := startRealImageKubelet(t, reg, tb.NS, "tls")
	tb.Create(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "registry-ca"}, Data: map[string]string{"ca-bundle.crt": string(reg.CAPEM())}})
	tb.Create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "robot"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: reg.DockerConfigJSON("robot", "s3cret")}})
	recipeInputs(t, tb, "tls", true, "tls")
	m := recipeModule(tb, reg, "tls", true, true)
	m.Spec.ModuleLoader.Container.RegistryTLS = kmmv1beta1.TLSOptions{} // verified TLS, with the bundle's CA
	m.Spec.ImageRepoSecret = &corev1.LocalObjectReference{Name: "robot"}
	tb.Create(m)
	img := reg.Host + "/tls:" + testbed.KernelA

	testbed.Eventually(t, 60*time.Second, func() (bool, string) {
		st := imageState(tb.NS, "tls", img)
		return st.State == image.Present, fmt.Sprintf("image %s Present, now %s (%s: %s)", img, st.State, st.Reason, st.Message)
	})
	tb.WaitLoaded("tls", img, tb.Nodes...)
	if b, s := k.pods("build"), k.pods("sign"); len(b) != 1 || len(s) != 1 {
		t.Fatalf("build pods %v, sign pods %v: want one of each", b, s)
	}
	assertSigned(t, reg, img, modulePath("tls"))
}

// assertSigned checks that the image's file ends with a module signature.
func assertSigned(t *testing.T, reg *ocireg.Registry, img, file string) {
	t.Helper()
	ref, err := name.ParseReference(img)
	if err != nil {
		t.Fatal(err)
	}
	im, err := remote.Image(ref, remote.WithTransport(reg.Server.Client().Transport), remote.WithAuth(&authn.Basic{Username: "robot", Password: "s3cret"}))
	if err != nil {
		t.Fatal(err)
	}
	data, err := imageFile(im, file)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(data), "~Module signature appended~\n") {
		t.Fatalf("%s in %s is not signed (ends %q)", file, img, data[max(0, len(data)-40):])
	}
}

// TestImageCheckFollowsTheRegistriesMirror: the Module's image names an origin that does not
// resolve; the operator's registries ConfigMap (--worker-registries-configmap, the worker's
// --operator-registries-conf) mirrors it to a registry that has the image. The check finds it
// there: Present, no build or sign pod, and the Module loads, as its worker would pull it.
func TestImageCheckFollowsTheRegistriesMirror(t *testing.T) {
	cluster.StartOperatorWith(t, func(o *app.Options) { o.WorkerRegistry.RegistriesConfigMap = "registries" })
	mirror := ocireg.Start(t, ocireg.Options{})
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	k := startImageKubelet(t, mirror, tb.NS)
	const origin = "kmm-origin.invalid:5000"
	tb.Create(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "registries"}, Data: map[string]string{"registries.conf": fmt.Sprintf(
		"[[registry]]\nprefix = %q\nlocation = %q\n[[registry.mirror]]\nlocation = %q\ninsecure = true\n", origin, origin, mirror.Host+"/cache")}})
	mirror.Push(t, "cache/gpu:"+testbed.KernelA)
	recipeInputs(t, tb, "gpu", false, "gpu")
	m := recipeModule(tb, mirror, "gpu", false, true)
	m.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = origin + "/gpu:$KERNEL_FULL_VERSION"
	m.Spec.ModuleLoader.Container.RegistryTLS = kmmv1beta1.TLSOptions{}
	tb.Create(m)
	img := origin + "/gpu:" + testbed.KernelA

	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		st := imageState(tb.NS, "gpu", img)
		return st.State == image.Present, fmt.Sprintf("image %s Present, now %s (%s: %s)", img, st.State, st.Reason, st.Message)
	})
	tb.WaitLoaded("gpu", img, tb.Nodes...)
	if b, s := k.pods("build"), k.pods("sign"); len(b)+len(s) != 0 {
		t.Fatalf("build pods %v, sign pods %v for an image the mirror has", b, s)
	}
}

// TestRefusedPush: the registry lets the Module's image be pulled but answers 403 DENIED to its
// push (issue 37 item 6), from the build pod and from the sign pod. Each ends in back-off with the
// registry's answer in the MIC and the Module's Degraded condition (ImageFailing), exactly one
// Event per failed attempt (one after the first), the second attempt only after the back-off
// (image.BackOffBase) and no other pod meanwhile, and a failed sign never builds.
func TestRefusedPush(t *testing.T) {
	cluster.StartOperator(t)
	reg := ocireg.Start(t, ocireg.Options{RefusePushTo: []string{"refused-build", "refused-sign"}})
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	k := startRealImageKubelet(t, reg, tb.NS, "refused-build", "refused-sign")
	recipeInputs(t, tb, "refused-build", true, "")
	tb.Create(recipeModule(tb, reg, "refused-build", true, false))
	recipeInputs(t, tb, "refused-sign", false, "refused-sign")
	src, err := kmodImage([]string{modulePath("refused-sign")})
	if err != nil {
		t.Fatal(err)
	}
	unsigned := reg.WriteImage(t, "unsigned/refused-sign:"+testbed.KernelA, src)
	m := recipeModule(tb, reg, "refused-sign", false, true)
	m.Spec.ModuleLoader.Container.KernelMappings[0].Sign.UnsignedImage = unsigned
	tb.Create(m)

	for _, c := range []struct {
		module, kind string
		backOff      kmmv1beta1.ImageMachineState
		failed       image.Trigger
	}{
		{"refused-build", "build", image.BuildBackOff, image.BuildFailed},
		{"refused-sign", "sign", image.SignBackOff, image.SignFailed},
	} {
		img := reg.Host + "/" + c.module + ":" + testbed.KernelA
		st := waitImageState(t, tb.NS, c.module, img, c.backOff, 30*time.Second)
		if !strings.Contains(st.Message, "DENIED") {
			t.Errorf("%s: the MIC message %q lacks the registry's answer", c.module, st.Message)
		}
		testbed.Eventually(t, 15*time.Second, func() (bool, string) {
			cond := moduleCondition(t, tb.NS, c.module, kmmv1beta1.ConditionDegraded)
			return cond.Reason == kmmv1beta1.ReasonImageFailing && strings.Contains(cond.Message, "DENIED"),
				fmt.Sprintf("%s Degraded ImageFailing with the registry's answer, got %s: %s", c.module, cond.Reason, cond.Message)
		})
		assertOneEvent(t, tb.NS, c.module, string(c.failed), "DENIED")
	}
	// Each failed once: the second attempt comes after the back-off, alone, and fails with one
	// more Event.
	for _, c := range []struct{ module, kind, reason string }{
		{"refused-build", "build", string(image.BuildFailed)}, {"refused-sign", "sign", string(image.SignFailed)},
	} {
		var st kmmv1beta1.ModuleImageState
		img := reg.Host + "/" + c.module + ":" + testbed.KernelA
		testbed.Eventually(t, 2*image.BackOffBase+10*time.Second, func() (bool, string) {
			st = imageState(tb.NS, c.module, img)
			return st.Attempts >= 2 && eventCount(t, tb.NS, c.module, c.reason) >= 2,
				fmt.Sprintf("%s: the second %s attempt failed with its Event, now %s after %d attempts", c.module, c.kind, st.State, st.Attempts)
		})
		pods, at := k.podsOf(c.module, c.kind)
		if len(pods) != int(st.Attempts) && len(pods) != int(st.Attempts)+1 { // +1: the next attempt, running
			t.Errorf("%s: %d %s pods for %d failed attempts, want one each: %v", c.module, len(pods), c.kind, st.Attempts, pods)
		}
		for i := 1; i < len(at); i++ {
			// Creation timestamps have whole seconds: a back-off of BackOffBase shows as at least one second less.
			if gap := at[i].Sub(at[i-1]); gap < image.BackOffBase-time.Second {
				t.Errorf("%s: %s pod %d came %s after the one before, within the back-off of %s", c.module, c.kind, i+1, gap, image.BackOffBase)
			}
		}
		// The Event of the latest failure may still be on its way; never more than one each.
		if n := eventCount(t, tb.NS, c.module, c.reason); n > int(st.Attempts) {
			t.Errorf("%s: %d Events %s for %d failed attempts, want one each", c.module, n, c.reason, st.Attempts)
		}
	}
	if b, _ := k.podsOf("refused-sign", "build"); len(b) != 0 {
		t.Errorf("build pods %v for a Module that only signs", b)
	}
}

// eventCount counts the Module's Events with reason, series included.
func eventCount(t *testing.T, ns, name, reason string) int {
	n := 0
	for _, e := range moduleEvents(t, ns, name, reason) {
		n++
		if e.Series != nil {
			n += int(e.Series.Count) - 1
		}
	}
	return n
}

// TestImageUnreadableServiceAccountIsReported: the build and sign pods mount the Module's
// ServiceAccount's pull secrets, and the check uses them, as worker pods do. When the operator may
// not read that ServiceAccount (its GETs go to the API server as a user without RBAC rules), the
// image's state says so (forbidden, naming it), with a Warning Event, and no build pod is made
// without the pull secrets; once the read is allowed the image is built and loads.
func TestImageUnreadableServiceAccountIsReported(t *testing.T) {
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	forbid := startOperatorForbiddenToGet(t, "/api/v1/namespaces/"+tb.NS+"/serviceaccounts/loader")
	reg := ocireg.Start(t, ocireg.Options{})
	k := startImageKubelet(t, reg, tb.NS)
	tb.Create(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "loader"},
		ImagePullSecrets: []corev1.LocalObjectReference{{Name: "team-registry"}}})
	recipeInputs(t, tb, "sa", true, "")
	m := recipeModule(tb, reg, "sa", true, false)
	m.Spec.ModuleLoader.ServiceAccountName = "loader"
	tb.Create(m)
	img := reg.Host + "/sa:" + testbed.KernelA

	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		st := imageState(tb.NS, "sa", img)
		return strings.Contains(st.Message, "forbidden") && strings.Contains(st.Message, tb.NS+"/loader"),
			fmt.Sprintf("the image's state naming the unreadable ServiceAccount, now %s (%s: %s)", st.State, st.Reason, st.Message)
	})
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		return eventCount(t, tb.NS, "sa", image.ReasonRegistryUnreachable)+eventCount(t, tb.NS, "sa", string(image.BuildFailed)) >= 1,
			"a Warning Event on the Module"
	})
	if b := k.pods("build"); len(b) != 0 {
		t.Fatalf("build pods %v made without the ServiceAccount's pull secrets", b)
	}
	forbid.Store(false)
	tb.WaitLoaded("sa", img, tb.Nodes...)
}
