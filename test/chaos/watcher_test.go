package chaos

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kmm-project/kmm/contract"
)

// workerPod is a load pod of kmm-chaos/mod0 on node-00 named name, with uid.
func workerPod(name string, uid types.UID, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name, UID: uid, Labels: map[string]string{
			contract.LabelWorker: "true", contract.LabelAction: "load",
			contract.LabelModuleNamespace: Namespace, contract.LabelModuleName: "mod0",
		}},
		Spec:   corev1.PodSpec{NodeName: "node-00"},
		Status: corev1.PodStatus{Phase: phase},
	}
}

// TestWatcherFollowsAPodReplacedUnderItsName replays what a relist delivers when a pair's finished
// worker pod was deleted and the next one created under the same name while the watch was down:
// an update from the old pod to the new one, no delete. The API server never held two pods; the
// watcher must not count two (issue 34: 26 false violations in a clean-clone CI run).
func TestWatcherFollowsAPodReplacedUnderItsName(t *testing.T) {
	w := newWatcher(newLeaseBook())
	w.podEvent(workerPod("kmm-worker-node-00-mod0", "uid-1", corev1.PodSucceeded), false)
	w.podEvent(workerPod("kmm-worker-node-00-mod0", "uid-2", corev1.PodRunning), false)
	w.podEvent(workerPod("kmm-worker-node-00-mod0", "uid-2", corev1.PodSucceeded), false)
	if _, viols, _ := w.result(); len(viols) != 0 {
		t.Fatalf("a pod replaced under its name was counted twice: %v", viols)
	}
	// The watcher still sees two pods of one pair when there are two: the delete of the second
	// name never came.
	w.podEvent(workerPod("kmm-worker-node-00-mod0-retry", "uid-3", corev1.PodRunning), false)
	_, viols, _ := w.result()
	if len(viols) != 1 || !strings.Contains(viols[0], "2 worker pods for kmm-chaos/mod0 on node-00") ||
		!strings.Contains(viols[0], "kmm-chaos/kmm-worker-node-00-mod0-retry (uid uid-3") || !strings.Contains(viols[0], "(at ") {
		t.Fatalf("two worker pods of a pair: violations %v, want one naming both pods, their UIDs and the time", viols)
	}
	// A deletion by name forgets the pod whatever its UID in the tombstone.
	w.podEvent(workerPod("kmm-worker-node-00-mod0-retry", "uid-3", corev1.PodRunning), true)
	w.podEvent(workerPod("kmm-worker-node-00-mod0", "uid-4", corev1.PodRunning), false)
	if _, viols, _ := w.result(); len(viols) != 1 {
		t.Fatalf("after the second pod's deletion: violations %v, want only the earlier one", viols)
	}
}
