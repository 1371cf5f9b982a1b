//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/e2e"
)

// TestRealNode checks what kmm needs from a real node: it goes Ready; a pod shaped like kmm's
// worker pod (controllers/workerpod.go: SYS_MODULE only, read-only root, the config through the
// downward API, hostPath mounts, the termination message) and its firmware variant (privileged)
// run from the local registry to Succeeded with their report as the termination message; a
// hostNetwork pod (as the operator runs here) reaches the API server with its service-account
// token; a DaemonSet with a node selector (as kmm's device plugin) follows the node label. That
// Stop leaves the host as Start found it is checked once the last test is done (TestMain).
func TestRealNode(t *testing.T) {
	c := cluster(t)
	ctx := context.Background()
	cs := c.Clientset()

	start := time.Now()
	c.WaitNodeReady(t, 2*time.Minute)
	tm.add("node Ready", start)

	probe, err := e2e.GoBinaryImage(ctx, t.TempDir(), "github.com/kmm-project/kmm/test/e2e/probe")
	if err != nil {
		t.Fatal(err)
	}
	probeRef, err := c.PushImage("kmm-e2e/probe:1", probe)
	if err != nil {
		t.Fatal(err)
	}
	ns := "e2e-node"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("worker-shaped pod runs to Succeeded with its termination message", func(t *testing.T) {
		host := filepath.Join(c.Dir, "host")
		modules := filepath.Join(host, "lib-modules")
		if err := os.MkdirAll(modules, 0o755); err != nil {
			t.Fatal(err)
		}
		marker := fmt.Sprintf("modules of the e2e node, %d", time.Now().UnixNano())
		if err := os.WriteFile(filepath.Join(modules, "marker"), []byte(marker), 0o644); err != nil {
			t.Fatal(err)
		}
		config := `{"e2e":"worker config"}`
		pod := workerShapedPod(ns, c.NodeName(), probeRef, c.NodeRegistryAddr(), host, config)
		start := time.Now()
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got := c.WaitPodPhase(t, ns, pod.Name, corev1.PodSucceeded, 2*time.Minute)
		tm.add("first pod (pulls pause and probe) created → Succeeded", start)
		want := map[string]string{
			"worker": strings.Join([]string{"cap sys_module=true", "cap sys_admin=false", "readonly-root=true",
				"read /lib/modules/marker=" + marker, "read " + contract.ConfigFile + "=" + config,
				"write /var/lib/kmm/cache/probe=ok", "write /tmp/probe=ok",
				"get http://" + c.NodeRegistryAddr() + "/v2/=200"}, "\n"),
			"firmware": strings.Join([]string{"cap sys_module=true", "cap sys_admin=true", "readonly-root=true",
				"exists /dev/kmsg=true", "write /var/lib/firmware/probe=ok"}, "\n"),
		}
		for _, st := range got.Status.ContainerStatuses {
			if st.State.Terminated == nil {
				t.Errorf("container %s not terminated: %+v", st.Name, st.State)
				continue
			}
			if msg := st.State.Terminated.Message; msg != want[st.Name] {
				t.Errorf("container %s termination message:\n%s\nwant:\n%s", st.Name, msg, want[st.Name])
			}
			delete(want, st.Name)
		}
		if len(want) > 0 {
			t.Errorf("no status for containers %v", want)
		}
		// The API server reaches the kubelet for logs (the probe prints its report on stdout too).
		logs, err := cs.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "firmware"}).DoRaw(ctx)
		if wantLog := "cap sys_module=true\ncap sys_admin=true"; err != nil || !strings.HasPrefix(string(logs), wantLog) {
			t.Errorf("logs of container firmware through the API server: %q, %v; want them to start with %q", logs, err, wantLog)
		}
		for file, content := range map[string]string{"cache/probe": "worker", "firmware/probe": "firmware"} {
			if data, err := os.ReadFile(filepath.Join(host, file)); err != nil || string(data) != content {
				t.Errorf("host file %s = %q, %v; want %q written by the pod through its hostPath mount", file, data, err, content)
			}
		}
	})

	t.Run("hostNetwork pod reaches the API server with its token", func(t *testing.T) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "api-client", Namespace: ns},
			Spec: corev1.PodSpec{
				HostNetwork:   true,
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "probe", Image: probeRef, Args: []string{"whoami"}, Env: c.HostNetworkEnv(),
					TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				}},
			},
		}
		start := time.Now()
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got := c.WaitPodPhase(t, ns, pod.Name, corev1.PodSucceeded, time.Minute)
		tm.add("hostNetwork pod (scheduled) created → Succeeded", start)
		want := "whoami=system:serviceaccount:" + ns + ":default"
		if msg := got.Status.ContainerStatuses[0].State.Terminated.Message; msg != want {
			t.Errorf("termination message %q, want %q", msg, want)
		}
		if got.Spec.NodeName != c.NodeName() {
			t.Errorf("pod bound to %q, want %q", got.Spec.NodeName, c.NodeName())
		}
	})

	t.Run("DaemonSet follows the node label", func(t *testing.T) {
		const label = "e2e.kmm.sigs.x-k8s.io/daemonset"
		sel := map[string]string{"app": "e2e-labelled"}
		ds := &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Name: "labelled", Namespace: ns},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: sel},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: sel},
					Spec: corev1.PodSpec{
						NodeSelector:                  map[string]string{label: "on"},
						TerminationGracePeriodSeconds: ptr.To(int64(5)),
						Containers:                    []corev1.Container{{Name: "pause", Image: c.PauseImage()}},
					},
				},
			},
		}
		if _, err := cs.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // the DaemonSet controller has seen it: no pod without the label
		if pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=e2e-labelled"}); err != nil || len(pods.Items) != 0 {
			t.Fatalf("DaemonSet pods before the node has the label: %v, %v", pods, err)
		}
		start := time.Now()
		setNodeLabel(t, c, label, ptr.To("on"))
		c.WaitDaemonSetReady(t, ns, ds.Name, time.Minute)
		tm.add("DaemonSet Ready after the node label is set", start)
		start = time.Now()
		setNodeLabel(t, c, label, nil)
		c.WaitNoPods(t, ns, "app=e2e-labelled", time.Minute)
		tm.add("DaemonSet pod gone after the label is removed", start)
	})
}

// setNodeLabel sets (or, with nil, removes) a label of the node.
func setNodeLabel(t *testing.T, c *e2e.Cluster, key string, value *string) {
	t.Helper()
	v := "null"
	if value != nil {
		v = fmt.Sprintf("%q", *value)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, key, v)
	if _, err := c.Clientset().CoreV1().Nodes().Patch(context.Background(), c.NodeName(), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// workerShapedPod is shaped like kmm's worker pod (controllers/workerpod.go): bound to the node,
// never restarted, no API token, the config through the downward API, /lib/modules read-only and
// the cache from the host, an emptyDir /tmp, SYS_MODULE only with a read-only root and the runtime's
// seccomp profile; and a second container as the firmware variant, privileged with the firmware
// directory from the host. The host paths are folders of the test (host/), mounted where kmm mounts
// the real ones. The worker container also fetches registry's /v2/ (kmm's worker pulls kmod images
// from a pod on the pod network).
func workerShapedPod(ns, node, image, registry, host, config string) *corev1.Pod {
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	sc := func(privileged bool) *corev1.SecurityContext {
		s := &corev1.SecurityContext{
			Privileged:             ptr.To(privileged),
			Capabilities:           &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"SYS_MODULE"}},
			RunAsUser:              ptr.To(int64(0)),
			ReadOnlyRootFilesystem: ptr.To(true),
			SeccompProfile:         &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		}
		if !privileged {
			s.AllowPrivilegeEscalation = ptr.To(false)
		}
		return s
	}
	resources := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "worker-shaped", Namespace: ns, Annotations: map[string]string{contract.AnnotationConfig: config}},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			RestartPolicy:                corev1.RestartPolicyNever,
			ActiveDeadlineSeconds:        ptr.To(int64(300)),
			AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{
				Name:  "worker",
				Image: image,
				Args: []string{"cap:sys_module", "cap:sys_admin", "readonly-root", "read:/lib/modules/marker",
					"read:" + contract.ConfigFile, "write:/var/lib/kmm/cache/probe=worker", "write:/tmp/probe=worker",
					"get:http://" + registry + "/v2/"},
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				SecurityContext:          sc(false),
				Resources:                resources,
				VolumeMounts: []corev1.VolumeMount{
					{Name: "config", MountPath: path.Dir(contract.ConfigFile), ReadOnly: true},
					{Name: "cache", MountPath: "/var/lib/kmm/cache"},
					{Name: "lib-modules", MountPath: "/lib/modules", ReadOnly: true},
					{Name: "tmp", MountPath: "/tmp"},
				},
			}, {
				Name:                     "firmware",
				Image:                    image,
				Args:                     []string{"cap:sys_module", "cap:sys_admin", "readonly-root", "exists:/dev/kmsg", "write:/var/lib/firmware/probe=firmware"},
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				SecurityContext:          sc(true),
				Resources:                resources,
				VolumeMounts:             []corev1.VolumeMount{{Name: "firmware", MountPath: contract.DefaultFirmwareHostPath}},
			}},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{{
					Path:     path.Base(contract.ConfigFile),
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + contract.AnnotationConfig + "']"},
				}}}}},
				{Name: "cache", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: filepath.Join(host, "cache"), Type: &dirOrCreate}}},
				{Name: "lib-modules", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: filepath.Join(host, "lib-modules")}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("16Mi"))}}},
				{Name: "firmware", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: filepath.Join(host, "firmware"), Type: &dirOrCreate}}},
			},
		},
	}
}
