package controllers_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/agent"
	"github.com/kmm-project/kmm/test/testbed"
)

// The test bed of this package (test/testbed): the cluster, its client and the agent playing the
// kubelet of every node.
var (
	cluster *testbed.Cluster
	k8s     client.Client
	node    *agent.Agent
)

func TestMain(m *testing.M) {
	// The controllers' logs are not what these tests look at (outcomes are): without a logger,
	// controller-runtime prints "SetLogger was never called" with a stack trace under -v.
	ctrllog.SetLogger(logr.Discard())
	c, err := testbed.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cluster, k8s, node = c, c.Client, c.Agent
	os.Exit(c.Run(m))
}

func workerPodsOn(t *testing.T, nodeName string) []corev1.Pod {
	t.Helper()
	pods := &corev1.PodList{}
	if err := k8s.List(context.Background(), pods, client.MatchingLabels{contract.LabelWorker: "true", contract.LabelNode: nodeName}); err != nil {
		t.Fatal(err)
	}
	return pods.Items
}
