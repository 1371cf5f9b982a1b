package v1beta1

// SpecEntry returns the spec entry of the Module namespace/name, nil when there is none or n is nil.
func (n *NodeModulesConfig) SpecEntry(namespace, name string) *NodeModuleSpec {
	if n == nil {
		return nil
	}
	for i := range n.Spec.Modules {
		if e := &n.Spec.Modules[i]; e.Namespace == namespace && e.Name == name {
			return e
		}
	}
	return nil
}

// StatusEntry returns the status entry of the Module namespace/name, nil when there is none or n
// is nil.
func (n *NodeModulesConfig) StatusEntry(namespace, name string) *NodeModuleStatus {
	if n == nil {
		return nil
	}
	for i := range n.Status.Modules {
		if st := &n.Status.Modules[i]; st.Namespace == namespace && st.Name == name {
			return st
		}
	}
	return nil
}
