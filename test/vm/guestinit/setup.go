package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sys/unix"

	"github.com/kmm-project/kmm/test/vm"
)

// guest is the prepared VM.
type guest struct {
	r      *reporter
	plan   vm.Plan
	bootID string
	// images maps a repository:tag of the layout to its reference in the guest's registry.
	images map[string]string
}

// setUp mounts the kernel file systems, brings up lo, starts the registry and pushes the images.
func setUp(r *reporter) (*guest, error) {
	if err := mountAll(); err != nil {
		return nil, err
	}
	// The kernel gives PID 1 only HOME and TERM; the worker and modprobe expect a PATH.
	if err := os.Setenv("PATH", "/sbin:/bin:/usr/sbin:/usr/bin"); err != nil {
		return nil, err
	}
	g := &guest{r: r}
	data, err := os.ReadFile(vm.PlanFile)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &g.plan); err != nil {
		return nil, fmt.Errorf("%s: %w", vm.PlanFile, err)
	}
	id, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return nil, err
	}
	g.bootID = strings.TrimSpace(string(id))
	if err := loopbackUp(); err != nil {
		return nil, fmt.Errorf("bringing up lo: %w", err)
	}
	if err := serveRegistry(); err != nil {
		return nil, err
	}
	g.images, err = pushLayout(vm.LayoutDir, vm.RegistryAddr)
	return g, err
}

// mountAll mounts proc, sysfs and devtmpfs and makes /tmp.
func mountAll() error {
	for _, m := range []struct{ fstype, dir string }{{"proc", "/proc"}, {"sysfs", "/sys"}, {"devtmpfs", "/dev"}} {
		if err := os.MkdirAll(m.dir, 0o750); err != nil {
			return err
		}
		if err := unix.Mount(m.fstype, m.dir, m.fstype, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mounting %s on %s: %w", m.fstype, m.dir, err)
		}
	}
	return os.MkdirAll("/tmp", 0o750)
}

// loopbackUp sets IFF_UP on lo with the SIOCSIFFLAGS ioctl (the VM has no other interface).
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd) //nolint:errcheck // a socket used for one ioctl
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// serveRegistry starts go-containerregistry's in-memory registry on addr.
func serveRegistry() error {
	ln, err := net.Listen("tcp", vm.RegistryAddr)
	if err != nil {
		return fmt.Errorf("starting the registry: %w", err)
	}
	srv := &http.Server{
		Handler:           registry.New(registry.Logger(log.New(io.Discard, "", 0))),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// pushLayout pushes every image of the OCI layout at dir that has a RefAnnotation to the registry
// at addr, and returns the references they got.
func pushLayout(dir, addr string) (map[string]string, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("opening the image layout: %w", err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	manifest, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	refs := map[string]string{}
	for _, desc := range manifest.Manifests {
		repoTag := desc.Annotations[vm.RefAnnotation]
		if repoTag == "" {
			continue
		}
		img, err := p.Image(desc.Digest)
		if err != nil {
			return nil, err
		}
		ref, err := name.ParseReference(addr + "/" + repoTag)
		if err != nil {
			return nil, err
		}
		if err := remote.Write(ref, img); err != nil {
			return nil, fmt.Errorf("pushing %s: %w", ref, err)
		}
		refs[repoTag] = ref.String()
	}
	return refs, nil
}
