package controllers_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/build"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/registry"
	"github.com/kmm-project/kmm/sign"
	"github.com/kmm-project/kmm/sign/signtest"
)

// This file lets imageKubelet run build and sign pods as their containers would, for the tests of
// the registry settings: the pod's volumes are written into a directory (Secrets, ConfigMaps, the
// downward API, projected pull secrets; host paths are the host's), its arguments point there, and
// the registry flags are parsed with registry.Flags, the definition the worker and the builder
// bind. A sign pod then runs sign.Image, as `worker sign` does; a build pod pushes a kmod image
// (a module at the path filesToSign names) with the keychain and trust those flags give, as
// BuildKit pushes with buildctl's config.json and buildkitd's CA files.

// podFS materialises the pod's volumes under dir and returns each mount path's directory there.
func podFS(ctx context.Context, p *corev1.Pod, dir string) (map[string]string, error) {
	vols := map[string]corev1.Volume{}
	for _, v := range p.Spec.Volumes {
		vols[v.Name] = v
	}
	mounts := map[string]string{}
	for _, m := range p.Spec.Containers[0].VolumeMounts {
		v := vols[m.Name]
		if v.HostPath != nil {
			mounts[m.MountPath] = v.HostPath.Path
			continue
		}
		d := filepath.Join(dir, m.Name)
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
		files, err := volumeFiles(ctx, p, v)
		if err != nil {
			return nil, err
		}
		for f, data := range files {
			if err := os.WriteFile(filepath.Join(d, f), data, 0o600); err != nil {
				return nil, err
			}
		}
		mounts[m.MountPath] = d
	}
	return mounts, nil
}

// volumeFiles are the files of a volume, as the kubelet writes them.
func volumeFiles(ctx context.Context, p *corev1.Pod, v corev1.Volume) (map[string][]byte, error) {
	out := map[string][]byte{}
	switch {
	case v.Secret != nil:
		return secretFiles(ctx, p.Namespace, v.Secret.SecretName, v.Secret.Items, false)
	case v.ConfigMap != nil:
		cm := &corev1.ConfigMap{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: v.ConfigMap.Name}, cm); err != nil {
			if v.ConfigMap.Optional != nil && *v.ConfigMap.Optional {
				return out, client.IgnoreNotFound(err)
			}
			return nil, err
		}
		for _, it := range v.ConfigMap.Items {
			if data, ok := cm.Data[it.Key]; ok {
				out[it.Path] = []byte(data)
			}
		}
	case v.DownwardAPI != nil:
		for _, it := range v.DownwardAPI.Items {
			key := strings.TrimSuffix(strings.TrimPrefix(it.FieldRef.FieldPath, "metadata.annotations['"), "']")
			out[it.Path] = []byte(p.Annotations[key])
		}
	case v.Projected != nil:
		for _, src := range v.Projected.Sources {
			files, err := secretFiles(ctx, p.Namespace, src.Secret.Name, src.Secret.Items, true)
			if err != nil {
				return nil, err
			}
			for f, data := range files {
				out[f] = data
			}
		}
	}
	return out, nil
}

func secretFiles(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional bool) (map[string][]byte, error) {
	s := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
		if optional {
			return map[string][]byte{}, client.IgnoreNotFound(err)
		}
		return nil, err
	}
	out := map[string][]byte{}
	for k, data := range s.Data {
		out[k] = data
	}
	if len(items) == 0 {
		return out, nil
	}
	picked := map[string][]byte{}
	for _, it := range items {
		if data, ok := out[it.Key]; ok {
			picked[it.Path] = data
		}
	}
	return picked, nil
}

// inPod is the file the container sees at p, under the materialised mounts (the longest mount
// path that holds it).
func inPod(mounts map[string]string, p string) string {
	best := ""
	for m := range mounts {
		if (p == m || strings.HasPrefix(p, m+"/")) && len(m) > len(best) {
			best = m
		}
	}
	if best == "" {
		return p
	}
	return filepath.Join(mounts[best], strings.TrimPrefix(p, best))
}

// podArgs are the container's arguments with the paths of the mounts rewritten, parsed: the
// registry flags with registry.Flags, the others by name.
func podArgs(p *corev1.Pod, mounts map[string]string, named ...string) (registry.Flags, map[string]string, error) {
	var rf registry.Flags
	fs := flag.NewFlagSet("pod", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	rf.Bind(fs)
	values := map[string]*string{}
	for _, n := range named {
		values[n] = fs.String(n, "", "")
	}
	var args []string
	for _, a := range p.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "/") {
			a = inPod(mounts, a)
		}
		args = append(args, a)
	}
	// Only the flags asked for and the registry's: drop the others with their values.
	var kept []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			continue
		}
		if fs.Lookup(strings.TrimPrefix(a, "--")) == nil {
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
				i++
			}
			continue
		}
		kept = append(kept, a)
		if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			kept = append(kept, args[i+1])
			i++
		}
	}
	if err := fs.Parse(kept); err != nil {
		return rf, nil, fmt.Errorf("the registry flags of %q: %w", p.Spec.Containers[0].Args, err)
	}
	out := map[string]string{}
	for n, v := range values {
		out[n] = *v
	}
	return rf, out, rf.Check()
}

// runRealSign runs the sign pod p as `worker sign` would and returns its result.
func runRealSign(ctx context.Context, p *corev1.Pod, dir string) contract.Result {
	res := contract.Result{Action: contract.ActionSign, Outcome: contract.OutcomeFailed}
	mounts, err := podFS(ctx, p, dir)
	if err != nil {
		res.Reason, res.Message = contract.ReasonOther, err.Error()
		return res
	}
	rf, named, err := podArgs(p, mounts, "config", "pull-secret")
	if err != nil {
		res.Reason, res.Message = contract.ReasonInvalidConfig, err.Error()
		return res
	}
	cfg, err := contract.ReadSignConfig(named["config"])
	if err != nil {
		res.Reason, res.Message = contract.ReasonInvalidConfig, err.Error()
		return res
	}
	res.Namespace, res.Name, res.Kernel = cfg.Namespace, cfg.Name, cfg.Kernel
	key, cert, err := sign.ReadKeyPair(inPod(mounts, contract.SignKeyFile), inPod(mounts, contract.SignCertFile))
	var s *sign.Signer
	if err == nil {
		s, err = sign.NewSigner(key, cert, sign.Options{})
	}
	if err != nil {
		res.Reason, res.Message = contract.ReasonSignKey, err.Error()
		return res
	}
	kc, err := rf.Keychain(named["pull-secret"])
	if err != nil {
		res.Reason, res.Message = contract.ReasonImagePull, err.Error()
		return res
	}
	out, err := sign.Image(ctx, s, sign.ImageOptions{
		Source: cfg.UnsignedImage, Target: cfg.Image, FilesToSign: cfg.FilesToSign,
		SourceTLS:  registry.ModuleTLS{Insecure: cfg.UnsignedImageRegistryTLS.Insecure, SkipVerify: cfg.UnsignedImageRegistryTLS.InsecureSkipTLSVerify},
		TargetTLS:  registry.ModuleTLS{Insecure: cfg.RegistryTLS.Insecure, SkipVerify: cfg.RegistryTLS.InsecureSkipTLSVerify},
		Registries: rf.Sources, Trust: rf.Trust, Keychain: kc,
	})
	if err != nil {
		res.Reason, res.Message = contract.ReasonImagePull, err.Error()
		if sign.ClassOf(err) == sign.ClassPush {
			res.Reason = contract.ReasonImagePush
		}
		return res
	}
	res.Outcome, res.ImageDigest = contract.OutcomeSucceeded, out.Digest.String()
	return res
}

// runRealBuild pushes, as the build pod p would, a kmod image with modules at modulePaths, with
// the credentials and the trust its arguments give, and returns its result.
func runRealBuild(ctx context.Context, p *corev1.Pod, dir string, modulePaths []string) build.Result {
	mounts, err := podFS(ctx, p, dir)
	if err != nil {
		return build.Result{Message: err.Error()}
	}
	rf, named, err := podArgs(p, mounts, strings.TrimPrefix(build.FlagImage, "--"), strings.TrimPrefix(build.FlagDockerConfig, "--"))
	if err != nil {
		return build.Result{Message: err.Error()}
	}
	res := build.Result{Image: named[strings.TrimPrefix(build.FlagImage, "--")]}
	pullSecret := ""
	if d := named[strings.TrimPrefix(build.FlagDockerConfig, "--")]; d != "" {
		pullSecret = filepath.Join(d, "config.json")
	}
	kc, err := rf.Keychain(pullSecret)
	if err != nil {
		res.Message = err.Error()
		return res
	}
	insecure := slices.Contains(p.Spec.Containers[0].Args, build.FlagPushInsecure)
	digest, err := pushKmod(ctx, res.Image, insecure, slices.Contains(p.Spec.Containers[0].Args, build.FlagPushSkipVerify), rf, kc, modulePaths)
	if err != nil {
		res.Message, res.Log = "pushing "+res.Image+" failed", err.Error()
		return res
	}
	res.Digest = digest
	return res
}

// pushKmod pushes an image with a fake module at each path to the origin of img, as the worker's
// registry settings reach it.
func pushKmod(ctx context.Context, img string, insecure, skipVerify bool, rf registry.Flags, kc authn.Keychain, modulePaths []string) (string, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(img, opts...)
	if err != nil {
		return "", err
	}
	eps, err := registry.PlanFor(rf.Sources, ref, registry.ModuleTLS{Insecure: insecure, SkipVerify: skipVerify})
	if err != nil {
		return "", err
	}
	origin := eps[len(eps)-1]
	ropts, err := origin.RemoteOptions(nil, rf.Trust, kc, remote.WithContext(ctx))
	if err != nil {
		return "", err
	}
	image, err := kmodImage(modulePaths)
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, image, ropts...); err != nil {
		return "", err
	}
	d, err := image.Digest()
	return d.String(), err
}

// kmodImage is a one-layer image with a fake module at each path.
func kmodImage(paths []string) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		data := signtest.FakeModule(path.Base(p), 512)
		if err := tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(p, "/"), Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		return nil, err
	}
	return mutate.AppendLayers(empty.Image, layer)
}

// imageFile reads file from the image's layers (the last layer that has it).
func imageFile(im v1.Image, file string) ([]byte, error) {
	rc := mutate.Extract(im)
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("%s not in the image", file)
		}
		if err != nil {
			return nil, err
		}
		if "/"+strings.TrimPrefix(hdr.Name, "/") == file {
			return io.ReadAll(tr)
		}
	}
}

// realResult runs p for real and returns the outcome and termination message imageKubelet.finish
// writes.
func (k *imageKubelet) realResult(ctx context.Context, p *corev1.Pod) (bool, string) {
	dir, err := os.MkdirTemp(k.t.TempDir(), "pod-")
	if err != nil {
		return false, err.Error()
	}
	if p.Labels["kmm.sigs.x-k8s.io/image-job"] == "build" {
		res := runRealBuild(ctx, p, dir, k.modulePaths)
		data, _ := json.Marshal(res)
		return res.Digest != "", string(data)
	}
	res := runRealSign(ctx, p, dir)
	data, _ := json.Marshal(res)
	return res.Outcome == contract.OutcomeSucceeded, string(data)
}
