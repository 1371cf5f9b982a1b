package vm

// SignModulesDir is where the signature test (sign_test.go, its init ./signinit) puts the modules
// it asks the kernel to load with module.sig_enforce=1, as <step>.ko, in SignSteps order.
const SignModulesDir = "/sign-modules"

// SignSteps are the modules of the signature test: dummy.ko without its signature, signed by kmm
// with a key the kernel does not have, the same with sig_len written little-endian (a malformed
// trailer), and Debian's own signed dummy.ko, last because it loads.
var SignSteps = []string{"unsigned", "fresh-key", "sig-len-little-endian", "distro-signed"}

// SignResult is what the signature test's init reports for one module.
type SignResult struct {
	// Errno is the name of finit_module's error (EKEYREJECTED, EBADMSG, …), "" when it loaded.
	Errno string `json:"errno"`
	// KernelLog are the kernel log lines the attempt added.
	KernelLog string `json:"kernelLog"`
}
