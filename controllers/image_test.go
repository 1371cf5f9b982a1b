package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
	"github.com/kmm-project/kmm/image"
	"github.com/kmm-project/kmm/test/ocireg"
	"github.com/kmm-project/kmm/test/testbed"
)

// recipeModule is a Module shaped like a GPU vendor operator's: one literal mapping for KernelA
// whose image is in reg, with build and/or sign on the mapping itself.
func recipeModule(tb *testbed.Bed, reg *ocireg.Registry, name string, build, signed bool) *kmmv1beta1.Module {
	m := tb.Module(name)
	c := &m.Spec.ModuleLoader.Container
	c.RegistryTLS = kmmv1beta1.TLSOptions{Insecure: true}
	km := kmmv1beta1.KernelMapping{Literal: testbed.KernelA, ContainerImage: reg.Host + "/" + name + ":$KERNEL_FULL_VERSION"}
	if build {
		km.Build = &kmmv1beta1.Build{DockerfileConfigMap: &corev1.LocalObjectReference{Name: name + "-dockerfile"},
			BuildArgs: []kmmv1beta1.BuildArg{{Name: "DRIVER_VERSION", Value: "550.1"}}}
	}
	if signed {
		km.Sign = &kmmv1beta1.Sign{KeySecret: &corev1.LocalObjectReference{Name: name + "-key"}, CertSecret: &corev1.LocalObjectReference{Name: name + "-cert"},
			FilesToSign: []string{"/opt/lib/modules/$KERNEL_FULL_VERSION/" + name + ".ko"}}
		if !build {
			km.Sign.UnsignedImage = reg.Host + "/" + name + ":$KERNEL_FULL_VERSION-unsigned"
		}
	}
	c.KernelMappings = []kmmv1beta1.KernelMapping{km}
	return m
}

// recipeInputs creates the Dockerfile ConfigMap and the key and certificate Secrets of
// recipeModule(name); certFor names whose key the certificate is for (name: the matching one).
func recipeInputs(t *testing.T, tb *testbed.Bed, name string, dockerfile bool, certFor string) {
	t.Helper()
	if dockerfile {
		tb.Create(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: name + "-dockerfile"},
			Data: map[string]string{"dockerfile": "FROM debian:bookworm\nRUN make\n"}})
	}
	if certFor == "" {
		return
	}
	key, cert := keyPair(t, name)
	if certFor != name {
		_, cert = keyPair(t, certFor)
	}
	tb.Create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: name + "-key"}, Data: map[string][]byte{"key": key}})
	tb.Create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: name + "-cert"}, Data: map[string][]byte{"cert": cert}})
}

// imageState reads the MIC status entry of img ("" state when none).
func imageState(ns, name, img string) kmmv1beta1.ModuleImageState {
	mic := &kmmv1beta1.ModuleImagesConfig{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, mic); err != nil {
		return kmmv1beta1.ModuleImageState{}
	}
	if st := mic.ImageStateEntry(img); st != nil {
		return *st
	}
	return kmmv1beta1.ModuleImageState{}
}

func waitImageState(t *testing.T, ns, name, img string, want kmmv1beta1.ImageMachineState, timeout time.Duration) kmmv1beta1.ModuleImageState {
	t.Helper()
	var st kmmv1beta1.ModuleImageState
	testbed.Eventually(t, timeout, func() (bool, string) {
		st = imageState(ns, name, img)
		return st.State == want, fmt.Sprintf("image %s in state %s, now %s (%s: %s)", img, want, st.State, st.Reason, st.Message)
	})
	return st
}

// moduleEvents are the Events on the Module with reason.
func moduleEvents(t *testing.T, ns, name, reason string) []eventsv1.Event {
	t.Helper()
	evs := &eventsv1.EventList{}
	if err := k8s.List(context.Background(), evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range evs.Items {
		if e.Reason == reason && e.Regarding.Kind == "Module" && e.Regarding.Name == name {
			out = append(out, e)
		}
	}
	return out
}

func moduleCondition(t *testing.T, ns, name, typ string) metav1.Condition {
	t.Helper()
	m := &kmmv1beta1.Module{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, m); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

func hasSpecEntry(t *testing.T, nodeName, ns, name string) bool {
	t.Helper()
	nmc := &kmmv1beta1.NodeModulesConfig{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: nodeName}, nmc); err != nil {
		return false
	}
	return nmc.SpecEntry(ns, name) != nil
}

// TestGPUVendorModuleLoadsWithoutBuildOrSign: a Module with build and sign on its literal mapping
// whose image is already in the registry loads, and no build or sign pod is ever created (issue 37:
// "nothing is built when the image exists").
func TestGPUVendorModuleLoadsWithoutBuildOrSign(t *testing.T) {
	cluster.StartOperator(t)
	reg := ocireg.Start(t, ocireg.Options{})
	tb := cluster.NewBed(t, 2, testbed.KernelA)
	k := startImageKubelet(t, reg, tb.NS)
	img := reg.Host + "/gpu:" + testbed.KernelA
	k.push(img)
	recipeInputs(t, tb, "gpu", true, "gpu")
	tb.Create(recipeModule(tb, reg, "gpu", true, true))
	tb.WaitLoaded("gpu", img, tb.Nodes...)
	if st := imageState(tb.NS, "gpu", img); st.State != image.Present || st.Status != kmmv1beta1.ImageExists {
		t.Fatalf("the image's MIC entry is %s/%s (%s), want Present/Exists", st.State, st.Status, st.Message)
	}
	if b, s := k.pods("build"), k.pods("sign"); len(b)+len(s) > 0 {
		t.Fatalf("build pods %v and sign pods %v were created for an image that exists", b, s)
	}
	// The MIC's spec was written once, while the image was checked and the nodes loaded: what the
	// API server stores reads back equal to what the controller computes (a difference would
	// rewrite it on every reconcile, each write queueing the next).
	mic := &kmmv1beta1.ModuleImagesConfig{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: tb.NS, Name: "gpu"}, mic); err != nil || mic.Generation != 1 {
		t.Fatalf("the MIC's spec was written %d times (%v), want once", mic.Generation, err)
	}
}

// TestBuildAndSignThenLoad: the image is missing: a build pod pushes the unsigned image, a sign pod
// the signed one, and only then do the nodes get their NMC entry and load it. While the build
// runs the Module says ImageNotReady and no node has an entry. Finished pods are deleted.
func TestBuildAndSignThenLoad(t *testing.T) {
	cluster.StartOperator(t)
	reg := ocireg.Start(t, ocireg.Options{})
	tb := cluster.NewBed(t, 2, testbed.KernelA)
	k := startImageKubelet(t, reg, tb.NS)
	k.set(func(k *imageKubelet) { k.hold = true })
	img := reg.Host + "/drv:" + testbed.KernelA
	recipeInputs(t, tb, "drv", true, "drv")
	tb.Create(recipeModule(tb, reg, "drv", true, true))

	waitImageState(t, tb.NS, "drv", img, image.Building, 30*time.Second)
	testbed.Eventually(t, 15*time.Second, func() (bool, string) {
		c := moduleCondition(t, tb.NS, "drv", kmmv1beta1.ConditionReady)
		return c.Reason == kmmv1beta1.ReasonImageNotReady && strings.Contains(moduleCondition(t, tb.NS, "drv", kmmv1beta1.ConditionProgressing).Message, img),
			fmt.Sprintf("Ready reason ImageNotReady naming %s, got %s: %s", img, c.Reason, c.Message)
	})
	for _, n := range tb.Nodes {
		if hasSpecEntry(t, n, tb.NS, "drv") || len(workerPodsOn(t, n)) > 0 {
			t.Fatalf("node %s has an NMC entry or a worker pod while its image is being built", n)
		}
	}
	k.set(func(k *imageKubelet) { k.hold = false })
	tb.WaitLoaded("drv", img, tb.Nodes...)

	signedAt, ok := k.pushedAt(img)
	if !ok {
		t.Fatal("the signed image was never pushed")
	}
	for _, n := range tb.Nodes {
		st := cluster.PairStatus(n, tb.NS, "drv")
		if first := st.Transitions[0].Time.Time; first.Before(signedAt.Truncate(time.Second)) {
			t.Fatalf("the pair on %s moved at %s, before the signed image was pushed at %s", n, first, signedAt)
		}
	}
	if b, s := k.pods("build"), k.pods("sign"); len(b) != 1 || len(s) != 1 {
		t.Fatalf("build pods %v, sign pods %v: want one of each", b, s)
	}
	testbed.Eventually(t, 15*time.Second, func() (bool, string) {
		pods := &corev1.PodList{}
		_ = k8s.List(context.Background(), pods, client.InNamespace(tb.NS), client.HasLabels{"kmm.sigs.x-k8s.io/image-job"})
		return len(pods.Items) == 0, fmt.Sprintf("the finished build and sign pods deleted, %d left", len(pods.Items))
	})
	st := imageState(tb.NS, "drv", img)
	var path []string
	for _, tr := range st.Transitions {
		path = append(path, string(tr.To))
	}
	if want := "Building Signing Checking Present"; !strings.HasSuffix(strings.Join(path, " "), want) {
		t.Fatalf("the image went through %v, want it to end with %s", path, want)
	}
}

// assertOneEvent checks that the Module has exactly one Event with reason (for one failure) whose
// note contains want.
func assertOneEvent(t *testing.T, ns, name, reason, want string) {
	t.Helper()
	var evs []eventsv1.Event
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		evs = moduleEvents(t, ns, name, reason)
		return len(evs) > 0, "an Event " + reason + " on the Module"
	})
	count := int32(0)
	for _, e := range evs {
		count++
		if e.Series != nil {
			count += e.Series.Count - 1
		}
		if !strings.Contains(e.Note, want) {
			t.Fatalf("Event %s says %q, want it to contain %q", reason, e.Note, want)
		}
	}
	if count != 1 {
		t.Fatalf("%d Events %s for one failure, want 1", count, reason)
	}
}

// TestMissingDockerfileConfigMap: the build's ConfigMap does not exist: no build pod is created,
// the image backs off with the reason in the MIC, the Module is Degraded (ImageFailing) saying so,
// one BuildFailed Event; once the ConfigMap exists the next attempt, after the back-off, builds.
func TestMissingDockerfileConfigMap(t *testing.T) {
	cluster.StartOperator(t)
	reg := ocireg.Start(t, ocireg.Options{})
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	k := startImageKubelet(t, reg, tb.NS)
	img := reg.Host + "/nocm:" + testbed.KernelA
	tb.Create(recipeModule(tb, reg, "nocm", true, false))

	st := waitImageState(t, tb.NS, "nocm", img, image.BuildBackOff, 30*time.Second)
	if !strings.Contains(st.Message, "nocm-dockerfile") || !strings.Contains(st.Message, "does not exist") {
		t.Fatalf("the MIC message %q does not name the missing ConfigMap", st.Message)
	}
	testbed.Eventually(t, 15*time.Second, func() (bool, string) {
		c := moduleCondition(t, tb.NS, "nocm", kmmv1beta1.ConditionDegraded)
		return c.Reason == kmmv1beta1.ReasonImageFailing && strings.Contains(c.Message, "does not exist"),
			fmt.Sprintf("Degraded ImageFailing naming the ConfigMap, got %s: %s", c.Reason, c.Message)
	})
	assertOneEvent(t, tb.NS, "nocm", string(image.BuildFailed), "nocm-dockerfile")
	if b := k.pods("build"); len(b) != 0 {
		t.Fatalf("build pods %v created without their ConfigMap", b)
	}
	recipeInputs(t, tb, "nocm", true, "")
	tb.WaitLoaded("nocm", img, tb.Nodes...) // after the 10 s back-off
	if b := k.pods("build"); len(b) != 1 {
		t.Fatalf("build pods %v, want one", b)
	}
}

// TestFailedBuildKeepsItsPodAndBacksOff: a build that fails puts the tail of its log in the MIC
// status and in one Event, keeps its pod (its log readable) through the back-off, and the next
// attempt deletes it; two attempts, two pods: no pod storm.
func TestFailedBuildKeepsItsPodAndBacksOff(t *testing.T) {
	cluster.StartOperator(t)
	reg := ocireg.Start(t, ocireg.Options{})
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	k := startImageKubelet(t, reg, tb.NS)
	logTail := "#7 [3/4] RUN make -C /usr/src/drv\nmake: *** [Makefile:5: all] Error 2"
	k.set(func(k *imageKubelet) { k.buildFail = logTail })
	img := reg.Host + "/bad:" + testbed.KernelA
	recipeInputs(t, tb, "bad", true, "")
	tb.Create(recipeModule(tb, reg, "bad", true, false))

	st := waitImageState(t, tb.NS, "bad", img, image.BuildBackOff, 30*time.Second)
	if !strings.Contains(st.Message, "Makefile:5: all] Error 2") {
		t.Fatalf("the MIC message %q lacks the build log's tail", st.Message)
	}
	assertOneEvent(t, tb.NS, "bad", string(image.BuildFailed), "Error 2")
	first := k.pods("build")
	if len(first) != 1 {
		t.Fatalf("build pods %v, want one", first)
	}
	failed := &corev1.Pod{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: tb.NS, Name: first[0]}, failed); err != nil || failed.Status.Phase != corev1.PodFailed {
		t.Fatalf("the failed build pod is not kept during the back-off: %v %s", err, failed.Status.Phase)
	}
	k.set(func(k *imageKubelet) { k.buildFail = "" })
	tb.WaitLoaded("bad", img, tb.Nodes...)
	if b := k.pods("build"); len(b) != 2 {
		t.Fatalf("build pods %v, want two (one per attempt)", b)
	}
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		err := k8s.Get(context.Background(), client.ObjectKey{Namespace: tb.NS, Name: first[0]}, &corev1.Pod{})
		return err != nil, "the failed pod of the first attempt deleted by the next"
	})
}

// TestKeyNotMatchingCertificate: the sign pod fails with SignKey (the key is not the certificate's):
// the reason reaches the MIC and one Event, the sign is retried after a back-off and the build is
// not (a failed sign never rebuilds); with a matching certificate the image is signed and loads.
func TestKeyNotMatchingCertificate(t *testing.T) {
	cluster.StartOperator(t)
	reg := ocireg.Start(t, ocireg.Options{})
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	k := startImageKubelet(t, reg, tb.NS)
	img := reg.Host + "/keyed:" + testbed.KernelA
	recipeInputs(t, tb, "keyed", true, "someone-else")
	tb.Create(recipeModule(tb, reg, "keyed", true, true))

	st := waitImageState(t, tb.NS, "keyed", img, image.SignBackOff, 30*time.Second)
	if !strings.Contains(st.Message, "SignKey") {
		t.Fatalf("the MIC message %q lacks the SignKey reason", st.Message)
	}
	assertOneEvent(t, tb.NS, "keyed", string(image.SignFailed), "SignKey")
	// The back-off (10 s) passes: the sign is attempted again, the build is not.
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		return len(k.pods("sign")) >= 2, fmt.Sprintf("a second sign attempt, sign pods %v", k.pods("sign"))
	})
	if b := k.pods("build"); len(b) != 1 {
		t.Fatalf("build pods %v after a failed sign, want the one build", b)
	}
	key, cert := keyPair(t, "keyed")
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "keyed-key"}, Data: map[string][]byte{"key": key}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "keyed-cert"}, Data: map[string][]byte{"cert": cert}},
	} {
		if err := k8s.Update(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	tb.WaitLoaded("keyed", img, tb.Nodes...)
	if b := k.pods("build"); len(b) != 1 {
		t.Fatalf("build pods %v, want the one build", b)
	}
}

// TestDeletingTheModuleCancelsItsBuild: a Module deleted while its build runs takes its build pod
// with it.
func TestDeletingTheModuleCancelsItsBuild(t *testing.T) {
	cluster.StartOperator(t)
	reg := ocireg.Start(t, ocireg.Options{})
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	k := startImageKubelet(t, reg, tb.NS)
	k.set(func(k *imageKubelet) { k.hold = true })
	recipeInputs(t, tb, "gone", true, "")
	m := recipeModule(tb, reg, "gone", true, false)
	tb.Create(m)
	testbed.Eventually(t, 30*time.Second, func() (bool, string) { return len(k.pods("build")) == 1, "a build pod" })
	if err := k8s.Delete(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		pods := &corev1.PodList{}
		_ = k8s.List(context.Background(), pods, client.InNamespace(tb.NS), client.HasLabels{"kmm.sigs.x-k8s.io/image-job"})
		return len(pods.Items) == 0, fmt.Sprintf("the build pod deleted with its Module, %d left", len(pods.Items))
	})
}

// TestRebuildTriggerOnAPresentImage: bumping imageRebuildTriggerGeneration has the image checked
// again; it is still in the registry, so nothing is built, and the loaded module stays loaded (the
// node keeps its entry while the image is checked: no unload, no reload).
func TestRebuildTriggerOnAPresentImage(t *testing.T) {
	cluster.StartOperator(t)
	reg := ocireg.Start(t, ocireg.Options{})
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	k := startImageKubelet(t, reg, tb.NS)
	img := reg.Host + "/again:" + testbed.KernelA
	k.push(img)
	recipeInputs(t, tb, "again", true, "")
	m := recipeModule(tb, reg, "again", true, false)
	tb.Create(m)
	tb.WaitLoaded("again", img, tb.Nodes...)
	before := len(cluster.PairStatus(tb.Nodes[0], tb.NS, "again").Transitions)

	gen := int64(7)
	m = editModule(t, client.ObjectKeyFromObject(m), func(m *kmmv1beta1.Module) { m.Spec.ImageRebuildTriggerGeneration = &gen })
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		st := imageState(tb.NS, "again", img)
		checked := st.RebuildTriggerGeneration != nil && *st.RebuildTriggerGeneration == gen && st.State == image.Present
		return checked, fmt.Sprintf("the image checked again for generation 7 and Present, now %s gen %v", st.State, st.RebuildTriggerGeneration)
	})
	st := imageState(tb.NS, "again", img)
	last := st.Transitions[len(st.Transitions)-2:]
	if last[0].Trigger != string(image.RebuildRequested) || last[1].Trigger != string(image.ImageFound) {
		t.Fatalf("the image's last transitions %+v, want RebuildRequested then ImageFound", last)
	}
	if b := k.pods("build"); len(b) != 0 {
		t.Fatalf("build pods %v for an image in the registry", b)
	}
	pair := cluster.PairStatus(tb.Nodes[0], tb.NS, "again")
	if pair.State != kmmv1beta1.StateLoaded || len(pair.Transitions) != before {
		t.Fatalf("the pair moved during the check: %s, %d transitions (was %d)", testbed.Describe(pair), len(pair.Transitions), before)
	}

	// The image is gone from the registry and the trigger bumped again: it is rebuilt, and while the
	// build runs the node keeps its entry and its module (the gate holds back new entries only).
	k.set(func(k *imageKubelet) { k.hold = true })
	if err := remote.Delete(mustRef(img), remote.WithTransport(reg.Server.Client().Transport)); err != nil {
		t.Fatal(err)
	}
	gen = 8
	m = editModule(t, client.ObjectKeyFromObject(m), func(m *kmmv1beta1.Module) { m.Spec.ImageRebuildTriggerGeneration = &gen })
	waitImageState(t, tb.NS, "again", img, image.Building, 20*time.Second)
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		c := moduleCondition(t, tb.NS, "again", kmmv1beta1.ConditionReady)
		return c.ObservedGeneration == m.Generation, "the Module's status for generation " + fmt.Sprint(m.Generation)
	})
	pair = cluster.PairStatus(tb.Nodes[0], tb.NS, "again")
	if pair == nil || pair.State != kmmv1beta1.StateLoaded || len(pair.Transitions) != before || !hasSpecEntry(t, tb.Nodes[0], tb.NS, "again") {
		t.Fatalf("the pair moved while its image is rebuilt: %s (%d transitions before)", testbed.Describe(pair), before)
	}
	k.set(func(k *imageKubelet) { k.hold = false })
	waitImageState(t, tb.NS, "again", img, image.Present, 20*time.Second)
	if b := k.pods("build"); len(b) != 1 {
		t.Fatalf("build pods %v, want the one rebuild", b)
	}
	tb.WaitLoaded("again", img, tb.Nodes...)
	if pair := cluster.PairStatus(tb.Nodes[0], tb.NS, "again"); pair == nil || len(pair.Transitions) != before {
		t.Fatalf("the pair was unloaded or reloaded around the rebuild: %s (%d transitions before)", testbed.Describe(pair), before)
	}
}

// TestPushBuiltImageBuildsAhead: a PreflightValidation with pushBuiltImage for a kernel no node
// runs yet has the Module's image for that kernel built ahead of the upgrade; its verdict stays
// InProgress while the image is built and turns Success once it is pushed.
func TestPushBuiltImageBuildsAhead(t *testing.T) {
	cluster.StartOperator(t)
	reg := ocireg.Start(t, ocireg.Options{})
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	k := startImageKubelet(t, reg, tb.NS)
	k.set(func(k *imageKubelet) { k.hold = true })
	recipeInputs(t, tb, "ahead", true, "")
	m := recipeModule(tb, reg, "ahead", true, false)
	c := &m.Spec.ModuleLoader.Container
	c.KernelMappings = append(c.KernelMappings, kmmv1beta1.KernelMapping{Regexp: `^6\.1\.0-57-`,
		ContainerImage: reg.Host + "/ahead:$KERNEL_FULL_VERSION", Build: c.KernelMappings[0].Build.DeepCopy()})
	now := reg.Host + "/ahead:" + testbed.KernelA
	next := reg.Host + "/ahead:" + testbed.KernelB
	k.push(now)
	tb.Create(m)
	tb.WaitLoaded("ahead", now, tb.Nodes...)
	if st := imageState(tb.NS, "ahead", next); st.State != "" {
		t.Fatalf("the next kernel's image is in the MIC (%s) before any PreflightValidation asks for it", st.State)
	}

	pv := &kmmv1beta2.PreflightValidation{ObjectMeta: metav1.ObjectMeta{Name: "ahead-" + tb.NS},
		Spec: kmmv1beta2.PreflightValidationSpec{KernelVersion: testbed.KernelB, PushBuiltImage: true}}
	tb.Create(pv)
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), pv) })
	waitImageState(t, tb.NS, "ahead", next, image.Building, 30*time.Second)
	verdict := func() kmmv1beta2.PreflightValidationModuleStatus {
		got := &kmmv1beta2.PreflightValidation{}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(pv), got); err == nil {
			for _, e := range got.Status.Modules {
				if e.Namespace == tb.NS && e.Name == "ahead" {
					return e
				}
			}
		}
		return kmmv1beta2.PreflightValidationModuleStatus{}
	}
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		v := verdict()
		return v.VerificationStatus == kmmv1beta2.VerificationInProgress && strings.Contains(v.StatusReason, "pushBuiltImage"),
			fmt.Sprintf("the verdict InProgress while the image is built, got %+v", v)
	})
	k.set(func(k *imageKubelet) { k.hold = false })
	waitImageState(t, tb.NS, "ahead", next, image.Present, 30*time.Second)
	testbed.Eventually(t, 60*time.Second, func() (bool, string) {
		v := verdict()
		return v.VerificationStatus == kmmv1beta2.VerificationSuccess, fmt.Sprintf("the verdict Success once the image is pushed, got %+v", v)
	})
	if b := k.pods("build"); len(b) != 1 {
		t.Fatalf("build pods %v, want the one for the next kernel", b)
	}
}
