package upgrade

import "testing"

func TestNextLabelsFollowsSeed002(t *testing.T) {
	cases := []struct {
		name string
		in   NodeLabels
		obs  Observed
		want NodeLabels
	}{
		{"first label on a fresh node: let the worker load v1", NodeLabels{Target: "v1"}, Observed{}, NodeLabels{Target: "v1", WorkerPod: "v1"}},
		{"v1 loaded: start its device plugin (step 5)", NodeLabels{Target: "v1", WorkerPod: "v1"}, Observed{Loaded: true, LoadedVersion: "v1"}, NodeLabels{Target: "v1", WorkerPod: "v1", DevicePlugin: "v1"}},
		{"v1 still loading: wait", NodeLabels{Target: "v1", WorkerPod: "v1"}, Observed{}, NodeLabels{Target: "v1", WorkerPod: "v1"}},
		{"target moved to v2: remove the device plugin label first (step 2)", NodeLabels{Target: "v2", WorkerPod: "v1", DevicePlugin: "v1"}, Observed{Loaded: true, LoadedVersion: "v1", DevicePluginPodOnNode: true}, NodeLabels{Target: "v2", WorkerPod: "v1"}},
		{"device plugin pod still there: wait", NodeLabels{Target: "v2", WorkerPod: "v1"}, Observed{LoadedVersion: "v1", DevicePluginPodOnNode: true}, NodeLabels{Target: "v2", WorkerPod: "v1"}},
		{"device plugin gone: remove the worker-pod label to unload v1 (step 3)", NodeLabels{Target: "v2", WorkerPod: "v1"}, Observed{LoadedVersion: "v1"}, NodeLabels{Target: "v2"}},
		{"v1 still loaded: wait for the unload", NodeLabels{Target: "v2"}, Observed{LoadedVersion: "v1"}, NodeLabels{Target: "v2"}},
		{"v1 unloaded: let the worker load v2 (step 4)", NodeLabels{Target: "v2"}, Observed{}, NodeLabels{Target: "v2", WorkerPod: "v2"}},
		{"user removed the label: device plugin off, then unload (manual flow)", NodeLabels{WorkerPod: "v1", DevicePlugin: "v1"}, Observed{Loaded: true, LoadedVersion: "v1"}, NodeLabels{WorkerPod: "v1"}},
		{"label removed and device plugin gone: unload", NodeLabels{WorkerPod: "v1"}, Observed{Loaded: true, LoadedVersion: "v1"}, NodeLabels{}},
		{"no label at all: nothing", NodeLabels{}, Observed{}, NodeLabels{}},
		{"DRA driver: its label stays while its pod runs (the NMC controller takes the pod away once no claim holds it), the worker-pod label goes",
			NodeLabels{Target: "v2", WorkerPod: "v1", DevicePlugin: "v1"}, Observed{Loaded: true, LoadedVersion: "v1", DevicePluginPodOnNode: true, DRA: true},
			NodeLabels{Target: "v2", DevicePlugin: "v1"}},
		{"DRA, label removed by the user: the same order", NodeLabels{WorkerPod: "v1", DevicePlugin: "v1"},
			Observed{Loaded: true, LoadedVersion: "v1", DevicePluginPodOnNode: true, DRA: true}, NodeLabels{DevicePlugin: "v1"}},
		{"DRA driver gone: its label goes (step 2)", NodeLabels{Target: "v2", WorkerPod: "v1", DevicePlugin: "v1"}, Observed{LoadedVersion: "v1", DRA: true},
			NodeLabels{Target: "v2", WorkerPod: "v1"}},
		{"DRA v2 loaded: start its driver (step 5)", NodeLabels{Target: "v2", WorkerPod: "v2"}, Observed{Loaded: true, LoadedVersion: "v2", DRA: true},
			NodeLabels{Target: "v2", WorkerPod: "v2", DevicePlugin: "v2"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := NextLabels(tc.in, tc.obs); got != tc.want {
				t.Fatalf("NextLabels(%+v, %+v) = %+v, want %+v", tc.in, tc.obs, got, tc.want)
			}
		})
	}
}
