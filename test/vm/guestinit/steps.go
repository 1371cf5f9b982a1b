package main

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/vm"
)

// The real modules of the guest kernel that the steps use. macvtap depends on macvlan and tap;
// dummy, macvlan and tap do not depend on each other.
const (
	dummy   = "dummy"
	macvtap = "macvtap"
	macvlan = "macvlan"
	tap     = "tap"
)

// testModules are all modules the steps load; none is loaded at boot or after the last step.
var testModules = []string{dummy, macvtap, macvlan, tap}

// firmwareHostDir is where the worker installs firmware (contract.DefaultFirmwareHostPath).
const firmwareHostDir = contract.DefaultFirmwareHostPath

// step is one part of the scenario; steps run in order in one boot and each leaves the kernel as
// the next one expects.
type step struct {
	name string
	run  func(g *guest)
}

func steps() []step {
	return []step{
		{"boot", stepBoot},
		{"patching", stepPatching},
		{"load", stepLoad},
		{"unload", stepUnload},
		{"intree", stepInTree},
		{"busy", stepBusy},
		{"unload-deps", stepUnloadDeps},
		{"order-load", stepOrderLoad},
		{"order-unload", stepOrderUnload},
		{"not-found", stepNotFound},
		{"wrong-kernel", stepWrongKernel},
		{"end", stepEnd},
	}
}

// stepBoot checks the guest before any worker run.
func stepBoot(g *guest) {
	g.r.check("boot", "kernel", readTrim("/proc/sys/kernel/osrelease") == g.plan.Kernel,
		"running kernel %s, plan %s", readTrim("/proc/sys/kernel/osrelease"), g.plan.Kernel)
	g.r.check("boot", "modules-absent", allIn("absent", testModules...), "%s", statesOf(testModules...))
	g.r.check("boot", "registry", g.images[vm.ImageRepo] != "" && g.images[vm.WrongKernelRepo] != "",
		"images served on the guest's loopback: %v", g.images)
}

// dummyConfig loads dummy with a parameter and the image's firmware.
func (g *guest) dummyConfig() contract.Config {
	return g.config(vm.ImageRepo, dummy, func(c *contract.Config) {
		c.Config.Modprobe.Parameters = []string{"numdummies=3"}
		c.Config.Modprobe.FirmwarePath = vm.FirmwareDir
		c.SetFirmwareClassPath = true
	})
}

// stepLoad loads dummy with numdummies=3 and firmware.
func stepLoad(g *guest) {
	const s = "load"
	run := g.runWorker(s, contract.ActionLoad, g.dummyConfig())
	g.checkRun(s, run, contract.OutcomeSucceeded, "")
	g.r.check(s, "loaded", allIn("live", dummy), "%s", statesOf(dummy))
	// numdummies is not in sysfs (permission 0); its effect is: dummy0..dummy2 exist, dummy3 not.
	g.r.check(s, "parameters", exists("/sys/class/net/dummy2") && !exists("/sys/class/net/dummy3"),
		"numdummies=3: /sys/class/net/dummy2 exists %t, dummy3 exists %t", exists("/sys/class/net/dummy2"), exists("/sys/class/net/dummy3"))
	fw := filepath.Join(firmwareHostDir, vm.FirmwareName)
	g.r.check(s, "firmware-file", readTrim(fw) == strings.TrimSpace(vm.FirmwareContent), "%s holds %q", fw, readTrim(fw))
	const classPath = "/sys/module/firmware_class/parameters/path"
	g.r.check(s, "firmware-class-path", readTrim(classPath) == firmwareHostDir, "%s = %q", classPath, readTrim(classPath))
}

// stepUnload unloads dummy again, which also removes its firmware.
func stepUnload(g *guest) {
	const s = "unload"
	run := g.runWorker(s, contract.ActionUnload, g.dummyConfig())
	g.checkRun(s, run, contract.OutcomeSucceeded, "")
	g.r.check(s, "unloaded", allIn("absent", dummy), "%s", statesOf(dummy))
	fw := filepath.Join(firmwareHostDir, vm.FirmwareName)
	g.r.check(s, "firmware-removed", !exists(fw), "%s exists %t", fw, exists(fw))
}

// stepInTree loads dummy from the guest's own /lib/modules (an "in-tree" module), then has the
// worker remove it before loading macvtap, which pulls in macvlan and tap.
func stepInTree(g *guest) {
	const s = "intree"
	out, err := exec.Command(vm.Modprobe, "-v", dummy).CombinedOutput() // #nosec G204 -- fixed argv
	g.r.check(s, "preloaded", err == nil && allIn("live", dummy), "modprobe -v dummy from /lib/modules: %v %s; %s",
		err, strings.TrimSpace(string(out)), statesOf(dummy))
	run := g.runWorker(s, contract.ActionLoad, g.config(vm.ImageRepo, macvtap, func(c *contract.Config) {
		c.Config.InTreeModulesToRemove = []string{dummy}
	}))
	g.checkRun(s, run, contract.OutcomeSucceeded, "")
	g.r.check(s, "in-tree-removed", allIn("absent", dummy), "%s", statesOf(dummy))
	g.r.check(s, "loaded-with-deps", allIn("live", macvtap, macvlan, tap), "%s", statesOf(macvtap, macvlan, tap))
	msgs := logMessages(run.log)
	removed := slices.IndexFunc(msgs, func(m string) bool { return strings.HasPrefix(m, "Removing an in-tree module") })
	loaded := slices.IndexFunc(msgs, func(m string) bool { return strings.HasPrefix(m, "Loading the module") })
	g.r.check(s, "removed-first", removed >= 0 && removed < loaded,
		"worker log: in-tree removal is message %d, load is message %d", removed, loaded)
}

// stepBusy asks the worker to unload macvlan while macvtap uses it.
func stepBusy(g *guest) {
	const s = "busy"
	run := g.runWorker(s, contract.ActionUnload, g.config(vm.ImageRepo, macvlan))
	g.checkRun(s, run, contract.OutcomeFailed, contract.ReasonBusy)
	g.r.check(s, "stderr", strings.Contains(run.res.Stderr, "in use"), "modprobe stderr: %q", run.res.Stderr)
	g.r.check(s, "still-loaded", allIn("live", macvtap, macvlan, tap), "%s", statesOf(macvtap, macvlan, tap))
}

// stepUnloadDeps unloads macvtap, which removes its now unused dependencies too.
func stepUnloadDeps(g *guest) {
	const s = "unload-deps"
	run := g.runWorker(s, contract.ActionUnload, g.config(vm.ImageRepo, macvtap))
	g.checkRun(s, run, contract.OutcomeSucceeded, "")
	g.r.check(s, "unloaded-with-deps", allIn("absent", macvtap, macvlan, tap), "%s", statesOf(macvtap, macvlan, tap))
}

// orderConfig loads dummy with modulesLoadingOrder [dummy, tap, macvlan]: macvlan, then tap,
// then dummy, although none of them depends on another.
func (g *guest) orderConfig() contract.Config {
	return g.config(vm.ImageRepo, dummy, func(c *contract.Config) {
		c.Config.Modprobe.ModulesLoadingOrder = []string{dummy, tap, macvlan}
	})
}

// stepOrderLoad checks that modulesLoadingOrder decides what loads and in which order.
func stepOrderLoad(g *guest) {
	const s = "order-load"
	run := g.runWorker(s, contract.ActionLoad, g.orderConfig())
	g.checkRun(s, run, contract.OutcomeSucceeded, "")
	g.r.check(s, "loaded", allIn("live", dummy, tap, macvlan), "%s", statesOf(dummy, tap, macvlan))
	// /proc/modules lists the most recently loaded module first.
	mods := loadedModules()
	iDummy, iTap, iMacvlan := slices.Index(mods, dummy), slices.Index(mods, tap), slices.Index(mods, macvlan)
	g.r.check(s, "kernel-order", iDummy >= 0 && iDummy < iTap && iTap < iMacvlan,
		"/proc/modules (newest first): %s", strings.Join(mods, " "))
	insmods := insmodOrder(logMessages(run.log))
	g.r.check(s, "insmod-order", slices.Equal(insmods, []string{macvlan, tap, dummy}), "modprobe -v inserted %v", insmods)
}

// insmodOrder returns the modules of the "insmod <file>" lines of modprobe -v's output.
func insmodOrder(msgs []string) []string {
	var mods []string
	for _, m := range msgs {
		for f := range strings.FieldsSeq(m) {
			if strings.HasSuffix(f, ".ko") {
				mods = append(mods, strings.TrimSuffix(filepath.Base(f), ".ko"))
			}
		}
	}
	return mods
}

// stepOrderUnload unloads the whole modulesLoadingOrder.
func stepOrderUnload(g *guest) {
	const s = "order-unload"
	run := g.runWorker(s, contract.ActionUnload, g.orderConfig())
	g.checkRun(s, run, contract.OutcomeSucceeded, "")
	g.r.check(s, "unloaded", allIn("absent", dummy, tap, macvlan), "%s", statesOf(dummy, tap, macvlan))
}

// stepNotFound loads a module the image does not have.
func stepNotFound(g *guest) {
	const s = "not-found"
	run := g.runWorker(s, contract.ActionLoad, g.config(vm.ImageRepo, "kmm_absent"))
	g.checkRun(s, run, contract.OutcomeFailed, contract.ReasonNotFound)
}

// stepWrongKernel loads a dummy.ko whose symbol CRCs belong to another kernel build.
func stepWrongKernel(g *guest) {
	const s = "wrong-kernel"
	run := g.runWorker(s, contract.ActionLoad, g.config(vm.WrongKernelRepo, dummy))
	g.checkRun(s, run, contract.OutcomeFailed, contract.ReasonOther)
	g.r.check(s, "rejected", strings.Contains(run.res.Message, "Exec format error"), "message: %s", run.res.Message)
	line := kernelLogLine("disagrees about version of symbol")
	g.r.check(s, "kernel-log", strings.Contains(line, "dummy: disagrees about version of symbol module_layout"), "kernel: %q", line)
	g.r.check(s, "not-loaded", allIn("absent", dummy), "%s", statesOf(dummy))
}

// stepEnd checks that the scenario left no test module loaded.
func stepEnd(g *guest) {
	g.r.check("end", "modules-absent", allIn("absent", testModules...), "%s", statesOf(testModules...))
}
