package agent_test

import (
	"testing"

	"github.com/kmm-project/kmm/test/agent"
	"github.com/kmm-project/kmm/worker"
)

func TestDefaultOutcome(t *testing.T) {
	for _, tc := range []struct {
		name       string
		action     worker.Action
		image      string
		cfgKernel  string
		nodeKernel string
		want       worker.Reason
		succeeded  bool
	}{
		{"load", worker.ActionLoad, "reg/kmod:v1", "6.1", "6.1", "", true},
		{"broken image", worker.ActionLoad, "reg/broken:v1", "6.1", "6.1", worker.ReasonImagePull, false},
		{"missing image", worker.ActionLoad, "reg/doesnotexist:v1", "6.1", "6.1", worker.ReasonImagePull, false},
		{"image beats kernel", worker.ActionLoad, "reg/broken:v1", "6.1", "6.2", worker.ReasonImagePull, false},
		{"other kernel", worker.ActionLoad, "reg/kmod:v1", "6.1", "6.2", worker.ReasonNotFound, false},
		{"unload anything", worker.ActionUnload, "reg/broken:v1", "6.1", "6.2", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config("ns", "m", tc.cfgKernel, tc.image)
			v := agent.DefaultOutcome(agent.RunInput{Node: "n", NodeKernel: tc.nodeKernel, Action: tc.action, Config: cfg})
			if (v.Outcome == worker.OutcomeSucceeded) != tc.succeeded || v.Reason != tc.want {
				t.Errorf("verdict = %+v, want succeeded=%v reason %q", v, tc.succeeded, tc.want)
			}
			if !tc.succeeded && v.Message == "" {
				t.Error("a failure without a message")
			}
		})
	}
}
