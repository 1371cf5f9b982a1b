package upgrade

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// ValidationContainerName is the name of the validation pod's container.
const ValidationContainerName = "validate"

// DefaultValidationTimeout is the validation pod's activeDeadlineSeconds when timeoutSeconds is 0.
const DefaultValidationTimeout = 600

// maxValidationMessage bounds what a failed validation pod's message keeps of its termination
// message (the kubelet's own bound is 4096 bytes, or the last 80 lines / 2048 bytes of its log).
const maxValidationMessage = 1024

// ValidationPodName is the deterministic name of the validation pod of Module m's version on node.
func ValidationPodName(m *kmmv1beta1.Module, node string) string {
	return contract.Bounded(fmt.Sprintf("kmm-validate-%s-%s-%s", m.Name, m.Spec.Version(), node), 253)
}

// NewValidationPod is the validation pod of Module m's version on node: the user's container, bound to
// the node (no scheduler: a cordon does not keep it out), with the Module's tolerations, never
// restarted, stopped after timeoutSeconds, its log's tail as its termination message when it
// fails without one. kmm's labels mark it as kmm's (a drain spares it) and name the Module, node
// and version; the Module owns it, so it goes with the Module.
func NewValidationPod(m *kmmv1beta1.Module, node string) *corev1.Pod {
	v := m.Spec.UpgradePolicy.Validation
	timeout := int64(v.TimeoutSeconds)
	if timeout == 0 {
		timeout = DefaultValidationTimeout
	}
	c := v.Container
	env := append([]corev1.EnvVar{{Name: "KMM_NODE_NAME", Value: node}, {Name: "KMM_MODULE_VERSION", Value: m.Spec.Version()}}, c.Env...)
	return &corev1.Pod{
		// The Module owns it (not as its controller): the garbage collector removes it with the Module.
		ObjectMeta: metav1.ObjectMeta{Namespace: m.Namespace, Name: ValidationPodName(m, node), OwnerReferences: []metav1.OwnerReference{{
			APIVersion: kmmv1beta1.GroupVersion.String(), Kind: "Module", Name: m.Name, UID: m.UID,
		}}, Labels: map[string]string{
			contract.LabelManagedBy: contract.ManagedBy, contract.LabelValidation: "true",
			contract.LabelModuleNamespace: m.Namespace, contract.LabelModuleName: m.Name,
			contract.LabelNode: contract.Bounded(node, contract.MaxLabelValue), contract.LabelVersion: m.Spec.Version(),
		}},
		Spec: corev1.PodSpec{
			NodeName: node, RestartPolicy: corev1.RestartPolicyNever, ActiveDeadlineSeconds: ptr.To(timeout),
			ServiceAccountName: v.ServiceAccountName, Tolerations: m.Spec.Tolerations,
			ImagePullSecrets: pullSecrets(m),
			Containers: []corev1.Container{{
				Name: ValidationContainerName, Image: c.Image, Command: c.Command, Args: c.Args, Env: env,
				ImagePullPolicy: c.ImagePullPolicy, Resources: c.Resources,
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}
}

func pullSecrets(m *kmmv1beta1.Module) []corev1.LocalObjectReference {
	if m.Spec.ImageRepoSecret == nil {
		return nil
	}
	return []corev1.LocalObjectReference{*m.Spec.ImageRepoSecret}
}

// ObserveValidation is what became of a validation pod: running until it ends; failed with its
// container's termination message (or log tail), or the pod's own reason (DeadlineExceeded past
// its timeout).
func ObserveValidation(p *corev1.Pod) ValidationPod {
	switch p.Status.Phase {
	case corev1.PodSucceeded:
		return ValidationPod{Phase: ValidationSucceeded}
	case corev1.PodFailed:
		return ValidationPod{Phase: ValidationFailed, Message: failureMessage(p)}
	}
	return ValidationPod{Phase: ValidationRunning}
}

func failureMessage(p *corev1.Pod) string {
	var parts []string
	if p.Status.Reason != "" {
		parts = append(parts, strings.TrimSpace(p.Status.Reason+" "+p.Status.Message))
	}
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			parts = append(parts, fmt.Sprintf("exit code %d: %s", t.ExitCode, strings.TrimSpace(t.Message)))
		}
	}
	msg := strings.Join(parts, "; ")
	if msg == "" {
		msg = "the pod failed"
	}
	if len(msg) > maxValidationMessage {
		msg = "…" + msg[len(msg)-maxValidationMessage:]
	}
	return msg
}
