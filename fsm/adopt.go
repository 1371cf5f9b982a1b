package fsm

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/internal/semantic"
)

// A takeover from upstream Kernel Module Management (docs/migration.md) leaves NMC status entries kmm
// never wrote: they have a config upstream's worker applied, upstream's boot ID and no state (kmm
// always writes one). Such an upstream record is decided on first sight: adopted as Loaded without
// a worker pod when it is exactly what kmm's spec wants in this boot, else handed to the normal
// rules (a reload after a reboot, an unload first when the config differs).

// UpstreamWait is how often an upstream record that must wait (an upstream worker pod still on the
// node, or a spec entry not yet written by kmm) is looked at again: upstream's pods are not watched.
const UpstreamWait = 5 * time.Second

// UpstreamRecord says whether a status entry is one upstream KMM left (an upstream record): a config
// and no state, which kmm never writes. The controllers ask it too, to read upstream's objects only
// for NMCs that hold one.
func UpstreamRecord(st *kmmv1beta1.NodeModuleStatus) bool {
	return st.State == "" && st.Config != nil && len(st.Transitions) == 0
}

// upstreamMustWait says why an upstream record cannot be decided on yet ("" when it can): an upstream
// worker pod of the pair may still change what is loaded, and a spec entry upstream wrote is not
// kmm's decision (the Module→NMC controller rewrites it first).
func (f *Facts) upstreamMustWait() string {
	switch {
	case f.UpstreamWorkerPresent:
		return "waiting for upstream KMM's worker pod of this module to finish"
	case f.Spec != nil && !f.SpecWrittenByKMM:
		return "waiting for kmm's spec entry to replace the one upstream KMM wrote"
	}
	return ""
}

// normalizeUpstream rewrites an upstream record in kmm's terms: upstream's insecurePull is
// registryTLS.insecure, its single inTreeModuleToRemove one of inTreeModulesToRemove, its entry
// version the config's, its bootId kmm's bootID; a config that loads what spec loads is spelled as
// spec spells it, so that the rules see no change where there is none.
func normalizeUpstream(st *kmmv1beta1.NodeModuleStatus, spec *kmmv1beta1.NodeModuleSpec) {
	c := st.Config
	if c.InsecurePull {
		c.RegistryTLS.Insecure = true
	}
	if m := c.InTreeModuleToRemove; m != "" && !slices.Contains(c.InTreeModulesToRemove, m) {
		c.InTreeModulesToRemove = append(c.InTreeModulesToRemove, m)
	}
	if c.Version == "" {
		c.Version = st.Version
	}
	if st.BootID == "" {
		st.BootID = st.UpstreamBootID
	}
	c.InsecurePull, c.InTreeModuleToRemove, st.Version, st.UpstreamBootID = false, "", "", ""
	if spec != nil && sameLoad(&spec.Config, c) {
		cfg := *spec.Config.DeepCopy()
		st.Config = &cfg
	}
}

// adoptable says whether the pair's upstream record (normalized) is what kmm's spec entry wants on
// the node's current kernel, recorded in the node's current boot: then the module is loaded as kmm
// would have loaded it, and no worker is needed.
func (f *Facts) adoptable() bool {
	if !f.fromUpstream || f.Spec == nil || !f.specKernelMatches() || f.Worker.Phase == PodRunning {
		return false
	}
	if f.Status.BootID == "" || f.Status.BootID != f.Node.BootID {
		return false
	}
	return sameLoad(&f.Spec.Config, f.Status.Config)
}

// sameLoad says whether two configs load the same thing, reading the defaults the two operators
// spell differently (an empty pull policy is IfNotPresent; insecureSkipTLSVerify is an insecure pull
// for upstream).
func sameLoad(spec, rec *kmmv1beta1.ModuleConfig) bool {
	a, b := *spec.DeepCopy(), *rec.DeepCopy()
	for _, c := range []*kmmv1beta1.ModuleConfig{&a, &b} {
		if c.ImagePullPolicy == "" {
			c.ImagePullPolicy = corev1.PullIfNotPresent
		}
		if c.Modprobe.DirName == "" {
			c.Modprobe.DirName = contract.DefaultDirName
		}
		c.RegistryTLS = kmmv1beta1.TLSOptions{Insecure: c.RegistryTLS.Insecure || c.RegistryTLS.InsecureSkipTLSVerify}
	}
	return semantic.Equal(&a, &b)
}

// recordAdopted makes the adopted record kmm's: the spec entry is what is loaded (equal to the
// record by sameLoad, and in kmm's spelling so that later comparisons see no change), in this boot.
func recordAdopted(st *kmmv1beta1.NodeModuleStatus, f *Facts) {
	cfg := *f.Spec.Config.DeepCopy()
	st.Config = &cfg
	st.ServiceAccountName = f.Spec.ServiceAccountName
	st.ImageRepoSecret = f.Spec.ImageRepoSecret.DeepCopy()
	st.Tolerations = copyTolerations(f.Spec.Tolerations)
	st.BootID = f.Node.BootID
	now := metav1.NewTime(f.Now)
	st.LastWorkerTime = &now
	st.Attempts = 0
}
