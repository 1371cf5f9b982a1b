package controllers_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/build"
	"github.com/kmm-project/kmm/contract"
	imagecontroller "github.com/kmm-project/kmm/controllers/image"
	"github.com/kmm-project/kmm/sign"
	"github.com/kmm-project/kmm/test/ocireg"
	"github.com/kmm-project/kmm/test/testbed"
)

// imageKubelet plays the kubelet of the build and sign pods of one namespace (the agent plays the
// worker pods'): a build pod (build.Pod's) pushes a random image under its --image and succeeds,
// or fails with buildFail as its log tail, writing a build.Result as kmm's builder does; a sign pod reads its key and certificate Secrets with the sign
// package, as `worker sign` does, fails with the worker's SignKey result when they do not make a
// signer (a key that is not the certificate's included), fails with ImagePull when its unsigned
// image is not in the registry, and otherwise pushes the signed image and succeeds. It records
// every build and sign pod created and when each image was pushed.
type imageKubelet struct {
	t   *testing.T
	reg *ocireg.Registry
	ns  string

	mu sync.Mutex
	// real runs the pods as their containers would (image_realpods_test.go); the build pushes a
	// kmod image with a module at each of modulePaths.
	real        bool
	modulePaths []string
	hold        bool
	buildFail   string
	created     []string // pod names, in creation order
	createdAt   map[string]time.Time
	pushed      map[string]time.Time
}

func startImageKubelet(t *testing.T, reg *ocireg.Registry, ns string) *imageKubelet {
	k := &imageKubelet{t: t, reg: reg, ns: ns, pushed: map[string]time.Time{}, createdAt: map[string]time.Time{}}
	testbed.Watch(t, cluster, &corev1.PodList{}, func(ev watch.EventType, p *corev1.Pod) {
		if ev == watch.Added {
			k.mu.Lock()
			k.created = append(k.created, p.Name)
			k.createdAt[p.Name] = p.CreationTimestamp.Time
			k.mu.Unlock()
		}
	}, client.InNamespace(ns), client.HasLabels{imagecontroller.LabelImageJob})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			k.runPods(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return k
}

func (k *imageKubelet) set(f func(k *imageKubelet)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	f(k)
}

func (k *imageKubelet) isReal() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.real
}

// pods are the build and sign pods created so far, by kind.
func (k *imageKubelet) pods(kind string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, n := range k.created {
		if strings.Contains(n, "-"+kind+"-") {
			out = append(out, n)
		}
	}
	return out
}

// podsOf are the module's pods of kind created so far, in creation order, with their creation times.
func (k *imageKubelet) podsOf(module, kind string) ([]string, []time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var names []string
	var at []time.Time
	for _, n := range k.created {
		if strings.HasPrefix(n, module+"-"+kind+"-") {
			names, at = append(names, n), append(at, k.createdAt[n])
		}
	}
	return names, at
}

func (k *imageKubelet) pushedAt(img string) (time.Time, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	at, ok := k.pushed[img]
	return at, ok
}

func (k *imageKubelet) runPods(ctx context.Context) {
	k.mu.Lock()
	hold, buildFail := k.hold, k.buildFail
	k.mu.Unlock()
	if hold {
		return
	}
	pods := &corev1.PodList{}
	if err := k8s.List(ctx, pods, client.InNamespace(k.ns), client.HasLabels{imagecontroller.LabelImageJob}); err != nil {
		return
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || !p.DeletionTimestamp.IsZero() {
			continue
		}
		var ok bool
		var msg string
		if k.isReal() {
			ok, msg = k.realResult(ctx, p)
		} else {
			ok, msg = k.run(ctx, p, buildFail)
		}
		k.finish(ctx, p, ok, msg)
	}
}

// run does what the pod's container would and returns its outcome and termination message.
func (k *imageKubelet) run(ctx context.Context, p *corev1.Pod, buildFail string) (bool, string) {
	c := p.Spec.Containers[0]
	if p.Labels[imagecontroller.LabelImageJob] == "build" {
		i := slices.Index(c.Args, build.FlagImage)
		if i < 0 || i+1 >= len(c.Args) {
			return false, fmt.Sprintf("the build pod has no %s argument: %q", build.FlagImage, c.Args)
		}
		res := build.Result{Image: c.Args[i+1]}
		switch {
		case buildFail != "":
			res.Message, res.Log = "the build failed: exit code 1", buildFail
		case k.push(res.Image):
			res.Digest = "sha256:" + strings.Repeat("0", 64)
		default:
			res.Message = "the push failed"
		}
		data, _ := json.Marshal(res)
		return res.Digest != "", string(data)
	}
	var cfg contract.SignConfig
	if err := json.Unmarshal([]byte(p.Annotations[contract.AnnotationConfig]), &cfg); err != nil {
		return false, err.Error()
	}
	res := contract.Result{Action: contract.ActionSign, Namespace: cfg.Namespace, Name: cfg.Name, Kernel: cfg.Kernel, Outcome: contract.OutcomeFailed}
	key, cert := k.secretKey(ctx, p, "key", "key"), k.secretKey(ctx, p, "cert", "cert")
	if s, c, err := sign.ParseKeyPair(key, cert); err != nil {
		res.Reason, res.Message = contract.ReasonSignKey, err.Error()
	} else if _, err := sign.NewSigner(s, c, sign.Options{}); err != nil {
		res.Reason, res.Message = contract.ReasonSignKey, err.Error()
	} else if _, err := remote.Head(mustRef(cfg.UnsignedImage), remote.WithContext(ctx), remote.WithTransport(k.reg.Server.Client().Transport)); err != nil {
		res.Reason, res.Message = contract.ReasonImagePull, err.Error()
	} else if k.push(cfg.Image) {
		res.Outcome, res.Reason, res.Message = contract.OutcomeSucceeded, "", ""
	}
	data, _ := json.Marshal(res)
	return res.Outcome == contract.OutcomeSucceeded, string(data)
}

// secretKey reads one key of the Secret a pod's volume mounts.
func (k *imageKubelet) secretKey(ctx context.Context, p *corev1.Pod, volume, key string) []byte {
	for _, v := range p.Spec.Volumes {
		if v.Name == volume && v.Secret != nil {
			s := &corev1.Secret{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: v.Secret.SecretName}, s); err == nil {
				return s.Data[key]
			}
		}
	}
	return nil
}

func mustRef(s string) name.Reference {
	ref, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		panic(err)
	}
	return ref
}

// push writes a random image as img and records when.
func (k *imageKubelet) push(img string) bool {
	im, err := random.Image(256, 1)
	if err != nil {
		return false
	}
	if err := remote.Write(mustRef(img), im, remote.WithTransport(k.reg.Server.Client().Transport)); err != nil {
		return false
	}
	k.mu.Lock()
	k.pushed[img] = time.Now()
	k.mu.Unlock()
	return true
}

// finish ends a pod as its container would: terminated with the message, Succeeded or Failed.
func (k *imageKubelet) finish(ctx context.Context, p *corev1.Pod, ok bool, msg string) {
	phase, code := corev1.PodSucceeded, int32(0)
	if !ok {
		phase, code = corev1.PodFailed, 1
	}
	_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		fresh := &corev1.Pod{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(p), fresh); err != nil {
			return client.IgnoreNotFound(err)
		}
		if fresh.UID != p.UID || fresh.Status.Phase == corev1.PodSucceeded || fresh.Status.Phase == corev1.PodFailed {
			return nil
		}
		fresh.Status.Phase = phase
		fresh.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: fresh.Spec.Containers[0].Name, Image: fresh.Spec.Containers[0].Image,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Message: msg, Reason: map[bool]string{true: "Completed", false: "Error"}[ok]}}}}
		return k8s.Status().Update(ctx, fresh)
	})
}

// keyPair is a PEM key and a self-signed PEM certificate for it, as the keySecret and certSecret
// hold them.
func keyPair(t *testing.T, cn string) (keyPEM, certPEM []byte) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

var _ = fmt.Sprintf
