package agent_test

import (
	"testing"

	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/agent"
)

func TestDefaultOutcome(t *testing.T) {
	for _, tc := range []struct {
		name       string
		action     contract.Action
		image      string
		cfgKernel  string
		nodeKernel string
		want       contract.Reason
		succeeded  bool
	}{
		{"load", contract.ActionLoad, "reg/kmod:v1", "6.1", "6.1", "", true},
		{"broken image", contract.ActionLoad, "reg/broken:v1", "6.1", "6.1", contract.ReasonImagePull, false},
		{"missing image", contract.ActionLoad, "reg/doesnotexist:v1", "6.1", "6.1", contract.ReasonImagePull, false},
		{"image beats kernel", contract.ActionLoad, "reg/broken:v1", "6.1", "6.2", contract.ReasonImagePull, false},
		{"other kernel", contract.ActionLoad, "reg/kmod:v1", "6.1", "6.2", contract.ReasonNotFound, false},
		{"unload anything", contract.ActionUnload, "reg/broken:v1", "6.1", "6.2", "", true},
		{"reload", contract.ActionReload, "reg/kmod:v2", "6.1", "6.1", "", true},
		{"reload of a broken image", contract.ActionReload, "reg/broken:v2", "6.1", "6.1", contract.ReasonImagePull, false},
		{"reload for another kernel", contract.ActionReload, "reg/kmod:v2", "6.1", "6.2", contract.ReasonNotFound, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config("ns", "m", tc.cfgKernel, tc.image)
			v := agent.DefaultOutcome(agent.RunInput{Node: "n", NodeKernel: tc.nodeKernel, Action: tc.action, Config: cfg})
			if (v.Outcome == contract.OutcomeSucceeded) != tc.succeeded || v.Reason != tc.want {
				t.Errorf("verdict = %+v, want succeeded=%v reason %q", v, tc.succeeded, tc.want)
			}
			if !tc.succeeded && v.Message == "" {
				t.Error("a failure without a message")
			}
			// Only a reload's NotFound comes after its unload; a pull failure comes before it.
			if wantLoadHalf := tc.action == contract.ActionReload && tc.want == contract.ReasonNotFound; (v.FailedStep == contract.StepLoad) != wantLoadHalf {
				t.Errorf("failed step %q", v.FailedStep)
			}
		})
	}
}
