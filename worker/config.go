package worker

import (
	"path"
	"strings"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// Where the worker finds things for a Config (contract.Config is what the operator sends): the
// firmware directory on the host and the directories of the kmod image it extracts.

// firmwareHostPath is FirmwareHostPath with its default, as a clean absolute path.
func firmwareHostPath(c contract.Config) string {
	if c.FirmwareHostPath == "" {
		return contract.DefaultFirmwareHostPath
	}
	return path.Clean("/" + c.FirmwareHostPath)
}

// imageRel turns a directory of the kmod image (absolute or not) into a clean path relative to the
// image root. ".." cannot climb above the root, so the result never leaves it; "" is the root.
func imageRel(dir string) string {
	return strings.TrimPrefix(path.Clean("/"+dir), "/")
}

// modulesRoot is the extraction-root-relative directory modprobe -d points at (the image's dirName).
func modulesRoot(mc kmmv1beta1.ModuleConfig) string {
	if mc.Modprobe.DirName == "" {
		return imageRel(contract.DefaultDirName)
	}
	return imageRel(mc.Modprobe.DirName)
}

// kernelDir is the extraction-root-relative <dirName>/lib/modules/<kernel>.
func kernelDir(mc kmmv1beta1.ModuleConfig) string {
	return path.Join(modulesRoot(mc), "lib/modules", mc.KernelVersion)
}

// hostLink is the extraction-root-relative <dirName>/lib/modules/<kernel>/host: the one entry of
// the image that may link to the node's module tree of the same kernel.
func hostLink(mc kmmv1beta1.ModuleConfig) string {
	return path.Join(kernelDir(mc), "host")
}

// firmwareDir is the extraction-root-relative firmware directory, "" when FirmwarePath is not set.
func firmwareDir(mc kmmv1beta1.ModuleConfig) string {
	if mc.Modprobe.FirmwarePath == "" {
		return ""
	}
	return imageRel(mc.Modprobe.FirmwarePath)
}
