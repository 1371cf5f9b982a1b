// Package vm is the real-kernel end-to-end test of kmm's worker: it boots a stock Debian kernel
// under qemu (software emulation, no KVM) with an initramfs whose init (./guestinit) serves a kmod
// image from an in-process registry on the guest's loopback and runs the project's real worker
// binary against the guest's running kernel, step by step, checking /proc/modules and /sys after
// each step.
//
// The test itself is behind the build tag "vm" (`make test-vm`, i.e. `go test -tags vm ./test/vm/`),
// so that `go test ./...` never boots a VM. It never touches the kernel of the machine it runs on:
// the only module loads happen inside the guest, and the guest init refuses to run unless it is PID 1.
//
// This file holds what the host test and the guest init share: the serial-console protocol, the
// paths inside the initramfs and the names of the images.
//
// The guest prints, on its serial console, lines that start with Prefix:
//
//	KMM-VM INFO <text>                       diagnostics
//	KMM-VM RESULT <step> <json>              the worker's termination-log result of a step
//	KMM-VM CHECK <step>/<name> PASS|FAIL <detail>
//	KMM-VM DONE <passed> passed, <failed> failed
//
// Everything else on the console (kernel messages, the worker's own log) is ignored by the host.
package vm

// Prefix starts every line of the protocol.
const Prefix = "KMM-VM "

// The kinds of protocol lines (the word after Prefix).
const (
	KindInfo   = "INFO"
	KindResult = "RESULT"
	KindCheck  = "CHECK"
	KindDone   = "DONE"
)

// The verdicts of a CHECK line.
const (
	Pass = "PASS"
	Fail = "FAIL"
)

// Paths inside the initramfs.
const (
	// PlanFile is the JSON-encoded Plan the host writes for the guest.
	PlanFile = "/etc/kmm-vm/plan.json"
	// LayoutDir is the OCI image layout holding the kmod images.
	LayoutDir = "/images"
	// WorkerBinary is the project's worker, built with CGO_ENABLED=0.
	WorkerBinary = "/bin/worker"
	// Modprobe is Debian's kmod (with its shared libraries next to it in the initramfs).
	Modprobe = "/sbin/modprobe"
)

// QemuAccel is the accelerator of every qemu guest the tests boot (this package's VM and the
// e2e's kubelet node): TCG, as KVM hangs on these machines even where /dev/kvm exists, with one
// host thread for all virtual CPUs. With a thread per CPU (qemu 7.2 of Debian 12), a CPU may go on
// running the int3 that the kernel put in and took out again while patching its own code (a static
// key switching, as a kubelet's first socket in a memory cgroup does): the kernel's int3 handler
// sees no int3 in memory, returns to the same instruction, and the CPU spins there for good. A
// kubelet guest then never registers; the patching step of TestWorkerInVM locks up within seconds.
const QemuAccel = "tcg,thread=single"

// QemuCPUs is the number of virtual CPUs of the guests: two, as the e2e's node has, so that code
// patching meets a CPU running the patched code.
const QemuCPUs = 2

// RegistryAddr is where the guest init serves the kmod images (the guest's own loopback).
const RegistryAddr = "127.0.0.1:5000"

// RefAnnotation is the OCI annotation that names an image of the layout (its repository:tag).
const RefAnnotation = "org.opencontainers.image.ref.name"

// The kmod images of the layout, as repository:tag below RegistryAddr.
const (
	// ImageRepo holds real modules of the guest kernel (dummy, macvlan, tap, macvtap) under
	// /opt/lib/modules/<kernel> with depmod's output, and a firmware file under FirmwareDir.
	ImageRepo = "kmod/kmm-vm:v1"
	// WrongKernelRepo holds dummy.ko with its signature removed and the CRC of module_layout
	// flipped, which is what a module built for another kernel looks like to this one.
	WrongKernelRepo = "kmod/kmm-vm-wrong-kernel:v1"
)

// Firmware shipped in ImageRepo.
const (
	// FirmwareDir is the image directory set as modprobe.firmwarePath.
	FirmwareDir = "/firmware"
	// FirmwareName is the firmware file in FirmwareDir.
	FirmwareName = "kmm-test.bin"
	// FirmwareContent is its content.
	FirmwareContent = "kmm vm test firmware\n"
)

// Plan is what the host tells the guest init.
type Plan struct {
	// Kernel is the version of the kernel the VM boots (uname -r in the guest).
	Kernel string `json:"kernel"`
}
