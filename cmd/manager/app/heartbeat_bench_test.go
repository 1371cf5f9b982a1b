package app

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/util/framer"
	"k8s.io/apimachinery/pkg/watch"
	restclientwatch "k8s.io/client-go/rest/watch"
)

// heartbeatNode is a real-looking Node as a kubelet posts it (the scale harness's RealNodes): its
// labels, addresses, capacity, five conditions, system info and 50 images, heartbeat time at.
func heartbeatNode(at time.Time) *corev1.Node {
	now := metav1.NewTime(at)
	n := &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: "node-0042", UID: "7f4b0b1e-0000-4000-8000-000000000042", ResourceVersion: "123456",
			Labels: map[string]string{"kubernetes.io/hostname": "node-0042", "kubernetes.io/os": "linux", corev1.LabelArchStable: "amd64",
				corev1.LabelInstanceTypeStable: "m6i.4xlarge", corev1.LabelTopologyRegion: "region-1", corev1.LabelTopologyZone: "region-1a",
				"node.kubernetes.io/pool": "pool-2", "node-role.kubernetes.io/worker": ""},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
				Time: &now, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:conditions":{}}}`), Subresource: "status"}}},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.43"}, {Type: corev1.NodeHostName, Address: "node-0042"}},
			Capacity: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceCPU: resource.MustParse("16"),
				corev1.ResourceMemory: resource.MustParse("65843452Ki"), corev1.ResourceEphemeralStorage: resource.MustParse("203056560Ki")},
			Allocatable: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceCPU: resource.MustParse("15890m"),
				corev1.ResourceMemory: resource.MustParse("64692476Ki"), corev1.ResourceEphemeralStorage: resource.MustParse("187136925387")},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
			NodeInfo: corev1.NodeSystemInfo{MachineID: fmt.Sprintf("%032x", 42), SystemUUID: "ec2a1b2c-0000-4000-8000-000000000042",
				BootID: "0f0e0d0c-0000-4000-8000-000000000042", KernelVersion: "6.1.0-kmm-scale", OSImage: "Linux", ContainerRuntimeVersion: "containerd://1.7.27",
				KubeletVersion: "v1.33.0", OperatingSystem: "linux", Architecture: "amd64"},
		},
	}
	for _, c := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeReady} {
		status, reason := corev1.ConditionFalse, "KubeletHasSufficient"+string(c)
		if c == corev1.NodeReady {
			status, reason = corev1.ConditionTrue, "KubeletReady"
		}
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: c, Status: status, Reason: reason,
			Message: "kubelet reports " + string(c), LastHeartbeatTime: now, LastTransitionTime: metav1.NewTime(at.Add(-time.Hour))})
	}
	for i := range 50 {
		repo := fmt.Sprintf("registry.example.com/team-%d/service-%d", i%7, i)
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{
			Names: []string{fmt.Sprintf("%s@sha256:%064x", repo, i), fmt.Sprintf("%s:v1.%d.%d", repo, i%13, i%5)}, SizeBytes: int64(20_000_000 + i*7_340_033)})
	}
	return n
}

// heartbeatStream is a watch stream of count MODIFIED events of heartbeatNode, each with a new
// heartbeat time, as kube-apiserver sends it to a client that asks for protobuf: length-delimited
// metav1.WatchEvent frames (the event raw, its object in the protobuf envelope), gzip-compressed and flushed after every event when zipped (the API
// server compresses the watches of a client that accepts gzip, and flushes every event).
func heartbeatStream(tb testing.TB, count int, zipped bool) []byte {
	tb.Helper()
	s, raw := protobuf.NewSerializer(NewScheme(), NewScheme()), protobuf.NewRawSerializer(NewScheme(), NewScheme())
	var buf bytes.Buffer
	out := io.Writer(&buf)
	var zw *gzip.Writer
	if zipped {
		zw = gzip.NewWriter(&buf)
		out = zw
	}
	frames := framer.NewLengthDelimitedFrameWriter(out)
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	for i := range count {
		var obj bytes.Buffer
		if err := s.Encode(heartbeatNode(t0.Add(time.Duration(i)*time.Second)), &obj); err != nil {
			tb.Fatal(err)
		}
		var ev bytes.Buffer
		if err := raw.Encode(&metav1.WatchEvent{Type: string(watch.Modified), Object: runtime.RawExtension{Raw: obj.Bytes()}}, &ev); err != nil {
			tb.Fatal(err)
		}
		if _, err := frames.Write(ev.Bytes()); err != nil {
			tb.Fatal(err)
		}
		if zw != nil {
			if err := zw.Flush(); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			tb.Fatal(err)
		}
	}
	return buf.Bytes()
}

// heartbeatDecoder reads stream as client-go's watch does for a protobuf watch of Nodes.
func heartbeatDecoder(tb testing.TB, stream []byte, zipped bool) *restclientwatch.Decoder {
	tb.Helper()
	r := io.NopCloser(bytes.NewReader(stream))
	if zipped {
		zr, err := gzip.NewReader(bytes.NewReader(stream))
		if err != nil {
			tb.Fatal(err)
		}
		r = zr
	}
	raw := protobuf.NewRawSerializer(NewScheme(), NewScheme())
	return restclientwatch.NewDecoder(streaming.NewDecoder(framer.NewLengthDelimitedFrameReader(r), raw),
		protobuf.NewSerializer(NewScheme(), NewScheme()))
}

// BenchmarkNodeStatusPost is what one Node status post of a busy cluster costs the operator before
// any controller sees it (issue 41, round six: docs/performance.md): the watch event read and
// decoded as client-go does, then the cache's transform (stripNode). "gzip" is the stream as
// kube-apiserver sends it to a client that accepts gzip (client-go's default, the operator's);
// "plain" without compression, for comparison (it saved no operator CPU at the scale harness,
// where TLS and HTTP/2 carry the bigger stream: see the section).
func BenchmarkNodeStatusPost(b *testing.B) {
	const perStream = 256
	for _, zipped := range []bool{true, false} {
		name := "plain"
		if zipped {
			name = "gzip"
		}
		b.Run(name, func(b *testing.B) {
			stream := heartbeatStream(b, perStream, zipped)
			b.ReportAllocs()
			start := processCPU(b)
			var d *restclientwatch.Decoder
			read := perStream
			for b.Loop() {
				if read == perStream {
					d, read = heartbeatDecoder(b, stream, zipped), 0
				}
				_, obj, err := d.Decode()
				if err != nil {
					b.Fatal(err)
				}
				read++
				if _, err := stripNode(obj); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(processCPU(b)-start)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(len(stream))/perStream, "wire-bytes/event")
		})
	}
}

// processCPU is the CPU time the process used so far (user + system, garbage collection on other
// cores included): the operator's budget is CPU, and ns/op is wall time on shared cores.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestHeartbeatStreamDecodes checks the benchmark's fixture: both streams decode to the Nodes that
// went in, each a status post later than the one before.
func TestHeartbeatStreamDecodes(t *testing.T) {
	for _, zipped := range []bool{true, false} {
		d := heartbeatDecoder(t, heartbeatStream(t, 3, zipped), zipped)
		var last time.Time
		for i := range 3 {
			typ, obj, err := d.Decode()
			if err != nil {
				t.Fatalf("zipped %v, event %d: %v", zipped, i, err)
			}
			n, ok := obj.(*corev1.Node)
			if typ != watch.Modified || !ok || len(n.Status.Images) != 50 || len(n.Status.Conditions) != 4 {
				t.Fatalf("zipped %v, event %d: %s %T", zipped, i, typ, obj)
			}
			at := n.Status.Conditions[0].LastHeartbeatTime.Time
			if !at.After(last) {
				t.Errorf("zipped %v, event %d: heartbeat %v not after %v", zipped, i, at, last)
			}
			last = at
		}
	}
}
