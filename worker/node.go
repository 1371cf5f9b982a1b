package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Modprobe runs the modprobe program. Implementations run it with exactly the given arguments
// and do not interpret them; the command lines are built by LoadArgs, UnloadArgs and InTreeRemoveArgs.
type Modprobe interface {
	// Run runs modprobe with args (without the program name) and returns its standard output and
	// standard error. A non-zero exit status is a non-nil error.
	Run(ctx context.Context, args []string) (stdout, stderr []byte, err error)
}

// ExecModprobe runs a modprobe binary, on a node or (with dry-run command lines) anywhere.
type ExecModprobe struct {
	// Path of the modprobe binary, e.g. /usr/sbin/modprobe.
	Path string
}

// Run implements Modprobe.
func (m ExecModprobe) Run(ctx context.Context, args []string) ([]byte, []byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, m.Path, args...) // #nosec G204 -- the binary is our own flag; arguments are argv, never a shell line
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	err := cmd.Run()
	return stdout.Bytes(), stderr.Bytes(), err
}

// ModprobeFunc adapts a function to Modprobe, for tests.
type ModprobeFunc func(ctx context.Context, args []string) ([]byte, []byte, error)

// Run implements Modprobe.
func (f ModprobeFunc) Run(ctx context.Context, args []string) ([]byte, []byte, error) {
	return f(ctx, args)
}

// Host is the node's filesystem as the worker reads and changes it. All paths are host paths
// (as the kernel sees them); an implementation maps them under its root.
type Host interface {
	// BootID returns the node's boot ID (/proc/sys/kernel/random/boot_id).
	BootID() (string, error)
	// InstallFirmware copies the files of the directory src (in the worker's filesystem) into the
	// host directory dest, replacing files of the same name.
	InstallFirmware(src fs.FS, dest string) error
	// RemoveFirmware removes from the host directory dest the files that src has.
	RemoveFirmware(src fs.FS, dest string) error
	// SetFirmwareClassPath writes dir to /sys/module/firmware_class/parameters/path.
	SetFirmwareClassPath(dir string) error
}

// DirHost is a Host whose "/" is the directory Root. On a node Root is "/" (or where the host's
// filesystem is mounted); in a sandbox it is any directory.
type DirHost struct {
	// Root is where the host's "/" is.
	Root string
	// Sandbox creates the sysfs file and its directories when missing. On a node (Sandbox false)
	// the sysfs attribute must exist: a missing one means firmware_class is absent or /sys is not mounted.
	Sandbox bool
}

// NewNodeHost returns the Host of a real node whose filesystem is at root ("/" in a worker pod).
func NewNodeHost(root string) *DirHost { return &DirHost{Root: root} }

// NewSandboxHost returns a Host that is the directory root, for dry runs and tests.
func NewSandboxHost(root string) *DirHost { return &DirHost{Root: root, Sandbox: true} }

// firmwareClassPath is the sysfs attribute of the kernel's firmware lookup path.
const firmwareClassPath = "sys/module/firmware_class/parameters/path"

// bootIDPath is where the kernel publishes the boot ID.
const bootIDPath = "proc/sys/kernel/random/boot_id"

// path maps a host path to the worker's filesystem. The host is trusted: its own symlinks (such as
// /lib -> usr/lib) are followed as the kernel would follow them.
func (h *DirHost) path(p string) string {
	return filepath.Join(h.Root, filepath.FromSlash(imageRel(p)))
}

// BootID implements Host.
func (h *DirHost) BootID() (string, error) {
	file := h.path(bootIDPath)
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("reading the boot ID: %w", err)
	}
	id := strings.TrimSpace(string(data))
	if id == "" {
		return "", fmt.Errorf("reading the boot ID: %s is empty", file)
	}
	return id, nil
}

// SetFirmwareClassPath implements Host.
func (h *DirHost) SetFirmwareClassPath(dir string) error {
	file := h.path(firmwareClassPath)
	flags := os.O_WRONLY
	if h.Sandbox {
		if err := os.MkdirAll(filepath.Dir(file), 0o750); err != nil {
			return err
		}
		flags |= os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(file, flags, 0o600)
	if err != nil {
		return fmt.Errorf("setting the firmware lookup path: %w", err)
	}
	if _, err := f.WriteString(dir); err != nil {
		_ = f.Close()
		return fmt.Errorf("setting the firmware lookup path: %w", err)
	}
	return f.Close()
}

// InstallFirmware implements Host. It is all or nothing: the whole tree is checked first (a
// dangling link or anything but files, directories and links to them fails the install), then
// copied into a staging directory beside dest, then renamed into place file by file, so that the
// kernel never reads half a firmware file; a failure removes what this call put there.
func (h *DirHost) InstallFirmware(src fs.FS, dest string) error {
	files, err := firmwareFiles(src)
	if err != nil {
		return err
	}
	destDir := h.path(dest)
	if err := checkFirmwareTargets(destDir, files); err != nil {
		return err
	}
	if err := os.MkdirAll(destDir, 0o755); err != nil { // #nosec G301 -- firmware directories are world-readable on a node
		return fmt.Errorf("installing firmware: %w", err)
	}
	stage, err := os.MkdirTemp(destDir, ".kmm-staging-")
	if err != nil {
		return fmt.Errorf("installing firmware: %w", err)
	}
	defer os.RemoveAll(stage) //nolint:errcheck // best effort: only what this call staged
	for _, p := range files {
		if err := copyFile(src, p, filepath.Join(stage, filepath.FromSlash(p))); err != nil {
			return fmt.Errorf("installing firmware %s: %w", p, err)
		}
	}
	return commitFirmware(stage, destDir, files)
}

// firmwareFiles lists the files of a firmware tree, refusing what cannot be installed whole.
// Links to directories are not followed (their content is not copied).
func firmwareFiles(src fs.FS) ([]string, error) {
	var files []string
	err := fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		st, err := fs.Stat(src, p)
		switch {
		case err != nil && d.Type()&fs.ModeSymlink != 0:
			return fmt.Errorf("firmware %s is a dangling link or leaves the firmware directory: %w", p, err)
		case err != nil:
			return fmt.Errorf("firmware %s: %w", p, err)
		case st.Mode().IsRegular():
			files = append(files, p)
		case !st.IsDir():
			return fmt.Errorf("firmware %s is not a regular file (%s)", p, st.Mode().Type())
		}
		return nil
	})
	return files, err
}

// checkFirmwareTargets refuses an install that would replace a host directory with a file.
func checkFirmwareTargets(destDir string, files []string) error {
	for _, p := range files {
		if st, err := os.Lstat(filepath.Join(destDir, filepath.FromSlash(p))); err == nil && st.IsDir() {
			return fmt.Errorf("installing firmware %s: %s is a directory on the host", p, filepath.Join(destDir, filepath.FromSlash(p)))
		}
	}
	return nil
}

// commitFirmware renames the staged files into destDir. If a rename fails, the files already
// moved are removed again (a file they replaced is not restored).
func commitFirmware(stage, destDir string, files []string) error {
	for i, p := range files {
		target := filepath.Join(destDir, filepath.FromSlash(p))
		err := os.MkdirAll(filepath.Dir(target), 0o755) // #nosec G301 -- firmware directories are world-readable on a node
		if err == nil {
			err = os.Rename(filepath.Join(stage, filepath.FromSlash(p)), target)
		}
		if err != nil {
			for _, done := range files[:i] {
				_ = os.Remove(filepath.Join(destDir, filepath.FromSlash(done)))
			}
			return fmt.Errorf("installing firmware %s: %w", p, err)
		}
	}
	return nil
}

// copyFile copies the regular file p of src (following links that stay inside src) to target,
// creating its directory.
func copyFile(src fs.FS, p, target string) error {
	in, err := src.Open(p)
	if err != nil {
		return err
	}
	defer in.Close() //nolint:errcheck // read-only
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return err
	}
	out, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644) // #nosec G302 -- firmware is world-readable on a node
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// RemoveFirmware implements Host.
func (h *DirHost) RemoveFirmware(src fs.FS, dest string) error {
	destDir := h.path(dest)
	return fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if err := os.Remove(filepath.Join(destDir, filepath.FromSlash(p))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing firmware %s: %w", p, err)
		}
		return nil
	})
}
