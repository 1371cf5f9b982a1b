package fsm

import corev1 "k8s.io/api/core/v1"

// copyTolerations is a deep copy of a toleration list (nil stays nil): the spec entry takes the
// Module's (DecideSpec) and the status entry the worker pod's (record), and neither may share them.
func copyTolerations(in []corev1.Toleration) []corev1.Toleration {
	if in == nil {
		return nil
	}
	out := make([]corev1.Toleration, len(in))
	for i := range in {
		in[i].DeepCopyInto(&out[i])
	}
	return out
}
