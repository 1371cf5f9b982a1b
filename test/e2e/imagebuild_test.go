//go:build e2e

package e2e_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/smallstep/pkcs7"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/build"
	"github.com/kmm-project/kmm/contract"
	imagectrl "github.com/kmm-project/kmm/controllers/image"
	"github.com/kmm-project/kmm/sign"
	"github.com/kmm-project/kmm/test/e2e"
	"github.com/kmm-project/kmm/test/poll"
)

// The Modules of the build and sign steps of TestKMM, in a namespace of their own (TestKMM's pod
// checks and kubectl kmm rows stay those of kmmNamespace).
const (
	buildNamespace = "e2e-build"
	// modBuilt is built by the operator's build pod (BuildKit), signed by its sign pod and loaded:
	// image missing, in the registry's private repositories.
	modBuilt = "kmod-build"
	// modBroken's Dockerfile fails in its RUN step.
	modBroken = "kmod-broken"
	// modVendor is shaped like a GPU vendor operator's Module: build and sign on its literal
	// mapping, its image already in the registry.
	modVendor = "vendor-gpu"
	// buildSecretValue is the value of the build secret; the Dockerfile puts it in the module's
	// version, so the built module shows the secret reached the build step.
	buildSecretValue = "from-a-build-secret"
	// buildSecretName and its key: the step reads /run/secrets/<name>/<key>.
	buildSecretName, buildSecretKey = "build-token", "token"
	// registrySecret is the Modules' imageRepoSecret: the private repositories' credentials.
	registrySecret = "registry-auth"
)

// imageEnv is what the build and sign steps share: set up beside `make images`, the Modules
// created right after the install, checked a few steps later.
type imageEnv struct {
	headers    *e2e.DebianKernel // the Debian kernel whose headers the Dockerfile builds against
	baseRef    string            // the build's base image (Debian gcc + those headers), at the node IP
	builderRef string            // kmm-builder, the operator's --builder-image
	key        crypto.Signer
	certDER    []byte
	pods       *podRecorder // the pods of buildNamespace
	created    time.Time    // when the Modules were created
	// reasons are the Ready reasons modBuilt went through, read until stopReasons.
	reasons     *reasonLog
	stopReasons context.CancelFunc
	// broken follows modBroken through its first failed build.
	broken *brokenLog
}

// prepareBuild fetches the headers' kernel and assembles the base image, and builds kmm-builder,
// side by side (run beside `make images`).
func (k *kmmEnv) prepareBuild() error {
	k.img = &imageEnv{}
	var base v1.Image
	err := parallel(
		func() error { return builderImage(filepath.Join(k.c.LogDir(), "builder-image.log")) },
		func() error {
			var err error
			if k.img.headers, err = e2e.FetchKernel(filepath.Join(shared.root, "bin", "e2e-kernel-cache"), e2e.FlavourCloud); err != nil {
				return err
			}
			base, err = e2e.BuildBaseImage(filepath.Join(shared.root, "bin", "e2e-kernel-cache", "build-base-debs"), k.img.headers)
			return err
		},
	)
	if err != nil {
		return err
	}
	if _, err := k.c.PushImage("kmm-e2e/build-base:"+k.img.headers.Release, base); err != nil {
		return err
	}
	k.img.baseRef = k.c.NodeRegistryAddr() + "/kmm-e2e/build-base:" + k.img.headers.Release
	k.img.builderRef, err = k.c.PushLayout("kmm/kmm-builder:e2e", filepath.Join(shared.dir, "images", "kmm-builder"))
	return err
}

// builtImage is modBuilt's image for the node's kernel, as the Module names it resolved.
func (k *kmmEnv) builtImage() string {
	return k.c.NodeRegistryAddr() + "/" + e2e.PrivatePrefix + "kmod-build:" + k.kernel
}

// testImageModulesCreated creates the three Modules with a recipe and what they need (the
// Dockerfile ConfigMaps, the signing key and certificate Secrets in upstream's formats, a build
// secret, the registry credentials); the operator builds, signs and loads while the next steps run.
func testImageModulesCreated(t *testing.T, k *kmmEnv) {
	ctx := context.Background()
	if _, err := k.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: buildNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var err error
	if k.img.pods, err = recordPods(k.watchCtx, k.cs, buildNamespace, k.watchWG); err != nil {
		t.Fatal(err)
	}
	k.img.key, k.img.certDER = signingKeyPair(t)
	keyDER, err := x509.MarshalPKCS8PrivateKey(k.img.key)
	if err != nil {
		t.Fatal(err)
	}
	auth := fmt.Appendf(nil, `{"auths":{%q:{"username":%q,"password":%q}}}`, k.c.NodeRegistryAddr(), e2e.PrivateUser, e2e.PrivatePassword)
	objs := []client.Object{
		dockerfileConfigMap("kmod-dockerfile", kmodDockerfile(e2e.KmodSourceText())),
		dockerfileConfigMap("broken-dockerfile", brokenDockerfile),
		// Upstream's formats: the private key PEM under "key", the certificate under "cert" (DER,
		// as the kernel build's signing_key.x509).
		secret("signing-key", corev1.SecretTypeOpaque, "key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})),
		secret("signing-cert", corev1.SecretTypeOpaque, "cert", k.img.certDER),
		secret(buildSecretName, corev1.SecretTypeOpaque, buildSecretKey, []byte(buildSecretValue)),
		secret(registrySecret, corev1.SecretTypeDockerConfigJson, corev1.DockerConfigJsonKey, auth),
	}
	for _, o := range objs {
		if err := k.cl.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	k.img.created = time.Now()
	for _, m := range []*kmmv1beta1.Module{k.builtModule(), k.brokenModule(), k.vendorModule()} {
		if err := k.cl.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	k.img.reasons = &reasonLog{}
	ctx, cancel := context.WithCancel(k.watchCtx)
	k.img.stopReasons = cancel
	k.watchWG.Go(func() { k.img.reasons.follow(ctx, k.cl, client.ObjectKey{Namespace: buildNamespace, Name: modBuilt}) })
	k.img.broken = &brokenLog{}
	k.watchWG.Go(func() { k.img.broken.follow(k.watchCtx, k) })
}

// recipeModule is a Module of buildNamespace selecting the node with one literal mapping for its
// kernel, as the GPU vendors' operators write them: build and sign on the mapping, the plain-HTTP
// registry's TLS option on it too.
func (k *kmmEnv) recipeModule(name, kernelModule, image string, b *kmmv1beta1.Build) *kmmv1beta1.Module {
	return &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: buildNamespace, Name: name},
		Spec: kmmv1beta1.ModuleSpec{
			Selector:        map[string]string{corev1.LabelHostname: k.node},
			ImageRepoSecret: &corev1.LocalObjectReference{Name: registrySecret},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				Modprobe: kmmv1beta1.ModprobeSpec{ModuleName: kernelModule},
				KernelMappings: []kmmv1beta1.KernelMapping{{
					Literal: k.kernel, ContainerImage: image, RegistryTLS: &kmmv1beta1.TLSOptions{Insecure: true}, Build: b,
					Sign: &kmmv1beta1.Sign{
						KeySecret: &corev1.LocalObjectReference{Name: "signing-key"}, CertSecret: &corev1.LocalObjectReference{Name: "signing-cert"},
						FilesToSign: []string{"/opt/lib/modules/$KERNEL_FULL_VERSION/extra/" + kernelModule + "*.ko"},
					},
				}},
			}},
		},
	}
}

func (k *kmmEnv) build(dockerfile string) *kmmv1beta1.Build {
	return &kmmv1beta1.Build{
		DockerfileConfigMap: &corev1.LocalObjectReference{Name: dockerfile},
		BuildArgs: []kmmv1beta1.BuildArg{
			{Name: "BASE", Value: k.img.baseRef}, {Name: "HEADERS_RELEASE", Value: k.img.headers.Release},
		},
		Secrets:              []corev1.LocalObjectReference{{Name: buildSecretName}},
		BaseImageRegistryTLS: kmmv1beta1.TLSOptions{Insecure: true},
	}
}

// builtModule: the image is missing; the operator builds, signs and loads it.
func (k *kmmEnv) builtModule() *kmmv1beta1.Module {
	return k.recipeModule(modBuilt, "kmm_e2e_build", k.c.NodeRegistryAddr()+"/"+e2e.PrivatePrefix+"kmod-build:$KERNEL_FULL_VERSION", k.build("kmod-dockerfile"))
}

// brokenModule: build only, a Dockerfile whose RUN step fails.
func (k *kmmEnv) brokenModule() *kmmv1beta1.Module {
	m := k.recipeModule(modBroken, "kmm_e2e_broken", k.c.NodeRegistryAddr()+"/"+e2e.PrivatePrefix+"kmod-broken:$KERNEL_FULL_VERSION", k.build("broken-dockerfile"))
	m.Spec.ModuleLoader.Container.KernelMappings[0].Sign = nil
	return m
}

// vendorModule: build and sign too, but its image is in the registry already.
func (k *kmmEnv) vendorModule() *kmmv1beta1.Module {
	return k.recipeModule(modVendor, kernelModules[modVendor], k.kmodImages[modVendor].ref, k.build("kmod-dockerfile"))
}

// testBuildAndSign checks what the operator did for modBuilt: one build pod on the node running
// the builder image, then one sign pod, both deleted after success; the Module ImageNotReady
// meanwhile; the signed image's module signed with the Secrets' key (verified against the
// certificate), built against the Debian headers with kmm's build args and the build secret; the
// NMC Loaded with that image (its digest), loaded by a worker started after the sign.
func testBuildAndSign(t *testing.T, k *kmmEnv) {
	img := k.img
	// A failed check, build or sign (an attempt counted) fails the step at once, with the
	// machine's message, rather than at the timeout: nothing here should fail.
	poll.Until(t, 8*time.Minute, 250*time.Millisecond, func() (bool, string) {
		e, err := k.micEntry(context.Background(), modBuilt, k.builtImage())
		if err == nil && e != nil && e.Attempts > 0 {
			t.Fatalf("%s: %s (%s): %s", modBuilt, e.State, e.Reason, e.Message)
		}
		st := k.pairIn(t, buildNamespace, modBuilt)
		return st != nil && st.State == kmmv1beta1.StateLoaded, describeStatus(st) + "; " + k.imageState(buildNamespace, modBuilt)
	})
	st := k.pairIn(t, buildNamespace, modBuilt)
	img.stopReasons()
	tm.add("build+sign: Module created → NMC Loaded (build pod, sign pod, worker; the steps before ran meanwhile)", img.created)
	builds, signs := imagePods(img.pods, modBuilt, "build"), imagePods(img.pods, modBuilt, "sign")
	if len(builds) != 1 || len(signs) != 1 {
		t.Fatalf("build pods %v, sign pods %v of %s: want one of each\n%s", builds, signs, modBuilt, describeEvents(img.pods.since(0)))
	}
	b, s := builds[0], signs[0]
	tm.addSpan("build+sign: build pod created → Succeeded (BuildKit on the node, kmod compiled, pushed with the pull secret)", b.created, b.done)
	tm.addSpan("build+sign: sign pod created → Succeeded (pull, sign, push)", s.created, s.done)
	tm.addSpan("build+sign: sign pod Succeeded → NMC Loaded", s.done, st.LastTransitionTime.Time)
	if b.last.Spec.NodeName != k.node || b.last.Spec.Containers[0].Image != img.builderRef {
		t.Errorf("build pod %s ran %s on %q, want the --builder-image %s on %s", b.name, b.last.Spec.Containers[0].Image, b.last.Spec.NodeName, img.builderRef, k.node)
	}
	if b.phase != corev1.PodSucceeded || s.phase != corev1.PodSucceeded || s.created.Before(b.done) {
		t.Errorf("build pod %s %s (done %s), sign pod %s %s (created %s): want both Succeeded, the sign after the build", b.name, b.phase, b.done, s.name, s.phase, s.created)
	}
	res := buildResult(t, b.last)
	if res.Image != imagectrl.UnsignedImage(k.builtModule(), k.builtImage()) || !strings.HasPrefix(res.Digest, "sha256:") {
		t.Errorf("the build pushed %s@%s, want the unsigned image %s", res.Image, res.Digest, imagectrl.UnsignedImage(k.builtModule(), k.builtImage()))
	}
	// The worker loaded the signed image, and started only after the sign.
	runs := k.img.pods.workerRuns(modBuilt)
	if len(runs) == 0 || runs[0].action != "load" || firstSeen(img.pods, runs[0].name).Before(s.done) {
		t.Errorf("worker pods of %s %v: want the load, created after the sign pod Succeeded (%s)", modBuilt, runs, s.done)
	}
	signed := k.pullPrivate(t, k.builtImage())
	digest, err := signed.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if st.Config.ContainerImage != k.builtImage() || st.ImageDigest != digest.String() {
		t.Errorf("NMC status loaded %s (%s), want the signed image %s (%s)", st.Config.ContainerImage, st.ImageDigest, k.builtImage(), digest)
	}
	k.checkSignedModule(t, signed, k.pullPrivate(t, res.Image))
	// The private repository refuses anonymous pulls: the pushes above used the pull secret.
	ref := privateRef(t, k.c, k.builtImage())
	var terr *transport.Error
	if _, err := remote.Head(ref); !errors.As(err, &terr) || terr.StatusCode != http.StatusUnauthorized {
		t.Errorf("an anonymous HEAD of %s: %v, want 401", ref, err)
	}

	if !isSubsequence([]string{kmmv1beta1.ReasonImageNotReady, kmmv1beta1.ReasonAllLoaded}, img.reasons.seen()) {
		t.Errorf("Ready reasons of %s: %v, want ImageNotReady then AllLoaded", modBuilt, img.reasons.seen())
	}
	mic := k.mic(t, modBuilt)
	var path []string
	if e := mic.ImageStateEntry(k.builtImage()); e != nil {
		for _, tr := range e.Transitions {
			path = append(path, string(tr.To))
		}
	}
	if !isSubsequence([]string{"Building", "Signing", "Checking", "Present"}, path) {
		t.Errorf("the image's transitions %v, want Building, Signing, Checking, Present", path)
	}
	// Both pods deleted after success.
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		left := livePods(img.pods, modBuilt)
		return len(left) == 0, fmt.Sprintf("build or sign pods of %s left: %v", modBuilt, left)
	})
	if evs, err := k.warnings(context.Background(), modBuilt); err != nil || len(evs) > 0 {
		t.Errorf("Warning Events on %s: %v %v", modBuilt, evs, err)
	}
	t.Logf("Ready reasons %v; image transitions %v", img.reasons.seen(), path)
}

// checkSignedModule reads the module in the signed and the unsigned image: the signed one carries
// a signature appended (the kernel's trailer) that verifies against the certificate of the Secret,
// over exactly the unsigned module's bytes, which were built against the Debian headers (vermagic)
// with kmm's build args and the build secret (version).
func (k *kmmEnv) checkSignedModule(t *testing.T, signed, unsigned v1.Image) {
	t.Helper()
	path := "opt/lib/modules/" + k.kernel + "/extra/kmm_e2e_build.ko"
	koOf := func(img v1.Image, what string) []byte {
		files, err := imageFiles(img)
		if err != nil {
			t.Fatal(err)
		}
		ko, ok := files[path]
		if !ok {
			t.Fatalf("the %s image has no %s; it has %v", what, path, keys(files))
		}
		if _, ok := files["opt/lib/modules/"+k.kernel+"/modules.dep"]; !ok {
			t.Errorf("the %s image has no modules.dep (depmod did not run)", what)
		}
		return ko
	}
	ko, plain := koOf(signed, "signed"), koOf(unsigned, "unsigned")
	if !strings.HasSuffix(string(ko), sign.Magic) {
		t.Fatalf("the signed image's module does not end with %q", sign.Magic)
	}
	module, sig, ok, err := sign.Split(ko)
	if err != nil || !ok {
		t.Fatalf("the signed module's trailer: signed %v, %v", ok, err)
	}
	if _, _, ok, _ := sign.Split(plain); ok || string(module) != string(plain) {
		t.Errorf("the unsigned image's module (signed %v, %d bytes) is not the signed one's %d module bytes", ok, len(plain), len(module))
	}
	cert, err := x509.ParseCertificate(k.img.certDER)
	if err != nil {
		t.Fatal(err)
	}
	p7, err := pkcs7.Parse(sig)
	if err != nil {
		t.Fatalf("the signature is not PKCS#7: %v", err)
	}
	p7.Content, p7.Certificates = module, []*x509.Certificate{cert}
	if err := p7.Verify(); err != nil {
		t.Errorf("the signature does not verify against the certificate: %v", err)
	}
	// RSA PKCS#1 v1.5 is deterministic: package sign, given the Secret's key, writes the same bytes.
	s, err := sign.NewSigner(k.img.key, cert, sign.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want, err := s.Signature(module); err != nil || string(want) != string(sig) {
		t.Errorf("the signature is not the one package sign makes with the Secret's key (%v)", err)
	}
	got := modinfo(t, module)
	dummy, err := os.ReadFile(filepath.Join(k.img.headers.Modules, "kernel", "drivers", "net", "dummy.ko"))
	if err != nil {
		t.Fatal(err)
	}
	if want := modinfo(t, dummy)["vermagic"]; got["vermagic"] == "" || got["vermagic"] != want {
		t.Errorf("vermagic of the built module %q, of Debian's dummy.ko for %s %q", got["vermagic"], k.img.headers.Release, want)
	}
	if want := buildNamespace + "." + modBuilt + "." + buildSecretValue; got["version"] != want {
		t.Errorf("module version %q, want MOD_NAMESPACE.MOD_NAME.<build secret> = %s", got["version"], want)
	}
	t.Logf("signed module %d bytes (%d of signature), vermagic %q, version %q", len(ko), len(sig), got["vermagic"], got["version"])
}

// testBrokenDockerfile: the failing build shows as Degraded ImageFailing with the step's output,
// exactly one BuildFailed Event for the failure (beside the Module's one summary Event for its
// move to Degraded), the failed pod kept during the back-off
// (observed by brokenLog from the Module's creation: the events.k8s.io recorder folds repeats of
// an Event into one series whose count the API server learns late, so one failure at a time is
// counted, the first).
func testBrokenDockerfile(t *testing.T, k *kmmEnv) {
	var b brokenSnapshot
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		b = k.img.broken.snapshot()
		return b.backOffOver && b.consistent, fmt.Sprintf("the first failed build of %s: %+v", modBroken, b)
	})
	tm.addSpan("failing Dockerfile: Module created → Degraded ImageFailing", k.img.created, b.failingAt)
	if b.degraded == nil || !strings.Contains(b.degraded.Message, brokenOutput) || !strings.Contains(b.degraded.Message, "did not complete successfully") {
		t.Errorf("Degraded ImageFailing without the step's output or BuildKit's verdict: %+v", b.degraded)
	}
	// The failure's Event (the image controller's), and the Module's summary Event for its move
	// to Degraded (once per change of the summary, not per failure).
	var failures, summaries, other []string
	for _, e := range b.events {
		switch {
		case strings.HasPrefix(e, "BuildFailed: "):
			failures = append(failures, e)
		case strings.HasPrefix(e, kmmv1beta1.ReasonImageFailing+": "):
			summaries = append(summaries, e)
		default:
			other = append(other, e)
		}
	}
	if len(failures) != 1 || !strings.Contains(failures[0], brokenOutput) || len(summaries) > 1 || len(other) > 0 {
		t.Errorf("Warning Events on %s for its first failed build: %q, want one BuildFailed with the step's output (and at most one ImageFailing summary)", modBroken, b.events)
	}
	if !b.podKept {
		t.Errorf("the failed build pod of %s was not kept during the back-off", modBroken)
	}
	t.Logf("Degraded: %.400s", b.degraded.Message)
}

// brokenLog follows modBroken through its first failed build.
type brokenLog struct {
	mu sync.Mutex
	s  brokenSnapshot
}

// brokenSnapshot is what brokenLog saw.
type brokenSnapshot struct {
	degraded  *metav1.Condition // the first Degraded ImageFailing
	failingAt time.Time
	// events are the Warning Events on the Module read between two reads of its image entry that
	// both said BuildBackOff after the first attempt, the last such read (consistent).
	events     []string
	consistent bool
	// podKept: a Failed build pod of the Module existed during that back-off.
	podKept bool
	// backOffOver: the entry left that first back-off.
	backOffOver bool
}

func (l *brokenLog) snapshot() brokenSnapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s
}

// follow reads the Module, its image entry, Events and pods every 250 ms until the first back-off
// is over or ctx ends.
func (l *brokenLog) follow(ctx context.Context, k *kmmEnv) {
	image := k.c.NodeRegistryAddr() + "/" + e2e.PrivatePrefix + "kmod-broken:" + k.kernel
	for !l.snapshot().backOffOver {
		l.observe(ctx, k, image)
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (l *brokenLog) observe(ctx context.Context, k *kmmEnv, image string) {
	m := &kmmv1beta1.Module{}
	if err := k.cl.Get(ctx, client.ObjectKey{Namespace: buildNamespace, Name: modBroken}, m); err != nil {
		return
	}
	before, err1 := k.micEntry(ctx, modBroken, image)
	events, err2 := k.warnings(ctx, modBroken)
	pods, err3 := k.cs.CoreV1().Pods(buildNamespace).List(ctx, metav1.ListOptions{LabelSelector: imagectrl.LabelImageJob + "=build," + contract.LabelModuleName + "=" + modBroken})
	after, err4 := k.micEntry(ctx, modBroken, image)
	if errors.Join(err1, err2, err3, err4) != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := meta.FindStatusCondition(m.Status.Conditions, kmmv1beta1.ConditionDegraded); l.s.degraded == nil && c != nil && c.Reason == kmmv1beta1.ReasonImageFailing {
		l.s.degraded, l.s.failingAt = c, time.Now()
	}
	firstBackOff := func(e *kmmv1beta1.ModuleImageState) bool {
		return e != nil && e.State == kmmv1beta1.ImageBuildBackOff && e.Attempts == 1
	}
	if l.s.consistent && !firstBackOff(after) {
		l.s.backOffOver = true
		return
	}
	if firstBackOff(before) && firstBackOff(after) && before.LastTransitionTime.Equal(after.LastTransitionTime) {
		l.s.events, l.s.consistent = events, true
		l.s.podKept = l.s.podKept || slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	}
}

// testVendorModule: with its image present, the vendor-shaped Module loads and no build or sign
// pod was ever created for it.
func testVendorModule(t *testing.T, k *kmmEnv) {
	st := k.waitLoadedIn(t, buildNamespace, modVendor, waitStep)
	tm.addSpan("vendor-shaped Module (build and sign, image present) created → Loaded", k.img.created, st.LastTransitionTime.Time)
	if p := append(imagePods(k.img.pods, modVendor, "build"), imagePods(k.img.pods, modVendor, "sign")...); len(p) > 0 {
		t.Errorf("build or sign pods of %s, whose image exists: %v", modVendor, p)
	}
	if e := k.mic(t, modVendor).ImageStateEntry(strings.ReplaceAll(k.kmodImages[modVendor].ref, "$KERNEL_FULL_VERSION", k.kernel)); e == nil || e.State != kmmv1beta1.ImagePresent || e.Attempts != 0 {
		t.Errorf("the vendor image's entry %+v, want Present", e)
	}
}

// testImageModulesDeleted deletes the three Modules: unloaded, finalizers released, every pod of
// the namespace gone (the broken Module's kept build pod with it).
func testImageModulesDeleted(t *testing.T, k *kmmEnv) {
	ctx := context.Background()
	start := time.Now()
	for _, m := range []string{modBuilt, modBroken, modVendor} {
		if err := k.cl.Delete(ctx, &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: buildNamespace, Name: m}}); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		list := &kmmv1beta1.ModuleList{}
		if err := k.cl.List(ctx, list, client.InNamespace(buildNamespace)); err != nil {
			return false, err.Error()
		}
		pods, err := k.cs.CoreV1().Pods(buildNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var names []string
		for _, p := range pods.Items {
			names = append(names, p.Name)
		}
		return len(list.Items) == 0 && len(pods.Items) == 0, fmt.Sprintf("%d Modules, pods %v left", len(list.Items), names)
	})
	tm.add("build+sign: the three Modules deleted → unloaded, finalizers released, pods gone", start)
	if p := k.img.pods.problems(); len(p) > 0 {
		t.Errorf("seen from the pod watch of %s:\n%s", buildNamespace, strings.Join(p, "\n"))
	}
}

// micEntry is the MIC status entry of a Module of buildNamespace's image (nil when none).
func (k *kmmEnv) micEntry(ctx context.Context, module, image string) (*kmmv1beta1.ModuleImageState, error) {
	mic := &kmmv1beta1.ModuleImagesConfig{}
	if err := k.cl.Get(ctx, client.ObjectKey{Namespace: buildNamespace, Name: module}, mic); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return mic.ImageStateEntry(image), nil
}

func (k *kmmEnv) mic(t *testing.T, module string) *kmmv1beta1.ModuleImagesConfig {
	t.Helper()
	mic := &kmmv1beta1.ModuleImagesConfig{}
	if err := k.cl.Get(context.Background(), client.ObjectKey{Namespace: buildNamespace, Name: module}, mic); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return mic
}

// warnings are the Warning Events on a Module of buildNamespace, "reason: note", one per
// occurrence (an Event's series counts its repeats).
func (k *kmmEnv) warnings(ctx context.Context, module string) ([]string, error) {
	evs, err := k.cs.EventsV1().Events(buildNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range evs.Items {
		if e.Type != corev1.EventTypeWarning || e.Regarding.Kind != "Module" || e.Regarding.Name != module {
			continue
		}
		n := 1
		if e.Series != nil {
			n = int(e.Series.Count)
		}
		for range n {
			out = append(out, e.Reason+": "+e.Note)
		}
	}
	return out, nil
}

// waitLoadedIn waits until a Module's pair is Loaded on the node.
func (k *kmmEnv) waitLoadedIn(t *testing.T, ns, name string, timeout time.Duration) *kmmv1beta1.NodeModuleStatus {
	t.Helper()
	var st *kmmv1beta1.NodeModuleStatus
	poll.Until(t, timeout, 250*time.Millisecond, func() (bool, string) {
		st = k.pairIn(t, ns, name)
		return st != nil && st.State == kmmv1beta1.StateLoaded && st.Config != nil, describeStatus(st) + "; " + k.imageState(ns, name)
	})
	return st
}

// imageState describes a Module's images and conditions, for failure messages.
func (k *kmmEnv) imageState(ns, name string) string {
	ctx := context.Background()
	m := &kmmv1beta1.Module{}
	mic := &kmmv1beta1.ModuleImagesConfig{}
	err := errors.Join(k.cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m), client.IgnoreNotFound(k.cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, mic)))
	var images []string
	for _, e := range mic.Status.ImagesStates {
		images = append(images, fmt.Sprintf("%s %s (%s) %.200s", e.Image, e.State, e.Reason, e.Message))
	}
	var conds []string
	for _, c := range m.Status.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s %s", c.Type, c.Status, c.Reason))
	}
	return fmt.Sprintf("conditions %v, images %v %v", conds, images, err)
}

// pullPrivate reads an image of the registry (through 127.0.0.1) with the private credentials.
func (k *kmmEnv) pullPrivate(t *testing.T, image string) v1.Image {
	t.Helper()
	img, err := remote.Image(privateRef(t, k.c, image), remote.WithAuth(e2e.PrivateAuth()))
	if err != nil {
		t.Fatalf("pulling %s: %v", image, err)
	}
	return img
}

// privateRef is an image named at the node IP, read through 127.0.0.1.
func privateRef(t *testing.T, c *e2e.Cluster, image string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(strings.Replace(image, c.NodeRegistryAddr(), c.RegistryAddr(), 1), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// imagePod is one build or sign pod as the watch saw it.
type imagePod struct {
	name          string
	phase         corev1.PodPhase
	created, done time.Time
	last          *corev1.Pod
	deleted       bool
}

func (p imagePod) String() string {
	return fmt.Sprintf("%s %s (deleted %v)", p.name, p.phase, p.deleted)
}

// imagePods are the build or sign pods of a Module, in the order they appeared.
func imagePods(r *podRecorder, module, kind string) []imagePod {
	var out []imagePod
	index := map[string]int{}
	for _, e := range r.since(0) {
		if e.pod.Labels[imagectrl.LabelImageJob] != kind || e.pod.Labels[contract.LabelModuleName] != module {
			continue
		}
		i, ok := index[e.pod.Name]
		if !ok {
			i = len(out)
			index[e.pod.Name] = i
			out = append(out, imagePod{name: e.pod.Name, created: e.at})
		}
		p := &out[i]
		p.last, p.phase = e.pod, e.pod.Status.Phase
		if (p.phase == corev1.PodSucceeded || p.phase == corev1.PodFailed) && p.done.IsZero() {
			p.done = e.at
		}
		p.deleted = p.deleted || e.typ == watch.Deleted
	}
	return out
}

// livePods are the build and sign pods of a Module not deleted yet.
func livePods(r *podRecorder, module string) []string {
	var out []string
	for _, kind := range []string{"build", "sign"} {
		for _, p := range imagePods(r, module, kind) {
			if !p.deleted {
				out = append(out, p.String())
			}
		}
	}
	return out
}

// firstSeen is when the watch first saw a pod.
func firstSeen(r *podRecorder, pod string) time.Time {
	for _, e := range r.since(0) {
		if e.pod.Name == pod {
			return e.at
		}
	}
	return time.Time{}
}

// reasonLog records the distinct successive reasons of a Module's Ready condition.
type reasonLog struct {
	mu      sync.Mutex
	reasons []string
}

// follow reads the Module every 200 ms until ctx ends.
func (r *reasonLog) follow(ctx context.Context, cl client.Client, key client.ObjectKey) {
	for {
		m := &kmmv1beta1.Module{}
		if err := cl.Get(ctx, key, m); err == nil {
			if c := meta.FindStatusCondition(m.Status.Conditions, kmmv1beta1.ConditionReady); c != nil {
				r.mu.Lock()
				if n := len(r.reasons); n == 0 || r.reasons[n-1] != c.Reason {
					r.reasons = append(r.reasons, c.Reason)
				}
				r.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (r *reasonLog) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.reasons...)
}

// signingKeyPair is a fresh RSA key and its self-signed certificate (DER), as a user makes the
// pair of the signing key Secrets.
func signingKeyPair(t *testing.T) (crypto.Signer, []byte) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "kmm e2e module signing key"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

func dockerfileConfigMap(name, dockerfile string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: buildNamespace, Name: name}, Data: map[string]string{build.DockerfileKey: dockerfile}}
}

func secret(name string, typ corev1.SecretType, key string, value []byte) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: buildNamespace, Name: name}, Type: typ, Data: map[string][]byte{key: value}}
}
