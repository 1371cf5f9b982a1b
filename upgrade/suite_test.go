package upgrade_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/agent"
	"github.com/kmm-project/kmm/test/testbed"
)

// The test bed of this package's integration tests (test/testbed): the cluster, its client and the
// agent playing the kubelet of every node. They are an external test package because the test bed
// runs the whole operator (cmd/manager/app), which imports this package.
var (
	cluster *testbed.Cluster
	k8s     client.Client
	node    *agent.Agent
)

// TestMain serves both test packages of upgrade (a test binary has one TestMain). It lengthens
// rapid's interleavings for the rollout simulation (unless -rapid.steps is given): a node needs
// seven steps to upgrade, and the interesting cases flip readiness in the middle. Then it starts
// the test bed the integration tests share.
func TestMain(m *testing.M) {
	flag.Parse()
	steps := false
	flag.Visit(func(f *flag.Flag) { steps = steps || f.Name == "rapid.steps" })
	if !steps {
		_ = flag.Set("rapid.steps", "100")
	}
	c, err := testbed.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cluster, k8s, node = c, c.Client, c.Agent
	os.Exit(c.Run(m))
}

// loadedAtV1 starts the operator on a bed of n nodes labelled v1 for the Module "nic", creates the
// Module at v1 with policy (and the device plugin, with withDevicePlugin) and waits until every
// node has v1 loaded: the start of the rollout tests on a real API server.
func loadedAtV1(t *testing.T, n int, policy *kmmv1beta1.UpgradePolicy, withDevicePlugin bool) (*testbed.Bed, *kmmv1beta1.Module) {
	t.Helper()
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, n, testbed.KernelA)
	for _, name := range tb.Nodes {
		cluster.SetNodeLabel(t, name, kmmv1beta1.ModuleVersionLabel(tb.NS, "nic"), "v1")
	}
	m := tb.VersionedModule("nic", "v1")
	if withDevicePlugin {
		m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dp:v1"}}
	}
	m.Spec.UpgradePolicy = policy
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:v1", tb.Nodes...)
	return tb, m
}
