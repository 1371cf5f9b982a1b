package v1beta1

import "testing"

func TestNMCEntries(t *testing.T) {
	var none *NodeModulesConfig
	if none.SpecEntry("ns", "a") != nil || none.StatusEntry("ns", "a") != nil {
		t.Fatal("a nil NMC has entries")
	}
	n := &NodeModulesConfig{
		Spec:   NodeModulesConfigSpec{Modules: []NodeModuleSpec{{Namespace: "ns", Name: "a"}, {Namespace: "other", Name: "b"}}},
		Status: NodeModulesConfigStatus{Modules: []NodeModuleStatus{{Namespace: "ns", Name: "b", State: StateLoaded}}},
	}
	if e := n.SpecEntry("other", "b"); e == nil || e != &n.Spec.Modules[1] {
		t.Errorf("SpecEntry(other, b) = %v, want the second entry itself", e)
	}
	if n.SpecEntry("ns", "b") != nil || n.StatusEntry("ns", "a") != nil {
		t.Error("an entry of another Module was returned")
	}
	if st := n.StatusEntry("ns", "b"); st == nil || st.State != StateLoaded {
		t.Errorf("StatusEntry(ns, b) = %v", st)
	}
}
