package upgrade_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

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
