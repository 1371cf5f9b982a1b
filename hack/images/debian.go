package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// debian fetches Debian packages with apt-get download through a private apt state under Dir (one
// per architecture: its own sources, lists and configuration), so that neither the host's dpkg
// architectures nor its apt lists change, and keeps the .deb files in Dir/debs so that a later
// build downloads nothing.
type debian struct {
	Dir            string        // cache directory
	Mirror         string        // Debian archive, e.g. http://deb.debian.org/debian
	SecurityMirror string        // Debian security archive, or "" for none
	Suite          string        // release, e.g. bookworm
	MaxAge         time.Duration // lists older than this are refreshed
	Log            io.Writer     // progress lines; nil for none
}

// keyring is Debian's archive keyring (package debian-archive-keyring); when present the private
// sources name it, otherwise apt's default trusted keys apply.
const keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"

func (d *debian) logf(format string, args ...any) {
	if d.Log != nil {
		_, _ = fmt.Fprintf(d.Log, format+"\n", args...)
	}
}

func (d *debian) aptDir(arch string) string { return filepath.Join(d.Dir, "apt", arch) }
func (d *debian) debDir() string            { return filepath.Join(d.Dir, "debs") }

// sources returns the private sources.list.
func (d *debian) sources() string {
	opt := ""
	if _, err := os.Stat(keyring); err == nil {
		opt = "[signed-by=" + keyring + "] "
	}
	var b strings.Builder
	fmt.Fprintf(&b, "deb %s%s %s main\n", opt, d.Mirror, d.Suite)
	fmt.Fprintf(&b, "deb %s%s %s-updates main\n", opt, d.Mirror, d.Suite)
	if d.SecurityMirror != "" {
		fmt.Fprintf(&b, "deb %s%s %s-security main\n", opt, d.SecurityMirror, d.Suite)
	}
	return b.String()
}

// config returns the private apt configuration for arch, read after the host's (apt-get -c), so
// that the host's proxy settings still apply. It points every state, cache and source directory
// into dir, sets the one architecture, and drops the host's update hooks and extra index targets,
// which are about the host's own package lists.
func (d *debian) config(arch, dir string) string {
	lines := []string{
		"#clear APT::Update::Post-Invoke-Success;",
		"#clear APT::Update::Post-Invoke;",
		`Acquire::IndexTargets::deb::DEP-11::DefaultEnabled "false";`,
		`Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled "false";`,
		`Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled "false";`,
		`Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled "false";`,
		`Acquire::Languages "none";`,
		`Dir::State "` + filepath.Join(dir, "state") + `";`,
		`Dir::State::status "` + filepath.Join(dir, "state", "status") + `";`,
		`Dir::Cache "` + filepath.Join(dir, "cache") + `";`,
		`Dir::Etc::SourceList "` + filepath.Join(dir, "sources.list") + `";`,
		`Dir::Etc::SourceParts "` + filepath.Join(dir, "sources.list.d") + `";`,
		`Dir::Etc::Preferences "` + filepath.Join(dir, "preferences") + `";`,
		`Dir::Etc::PreferencesParts "` + filepath.Join(dir, "preferences.d") + `";`,
		`APT::Architecture "` + arch + `";`,
		`#clear APT::Architectures;`,
		`APT::Architectures { "` + arch + `"; };`,
	}
	if os.Geteuid() == 0 {
		// apt drops root to the _apt user for downloads, which cannot write into a cache owned
		// by root; apt would fall back to root with a warning.
		lines = append(lines, `APT::Sandbox::User "root";`)
	}
	return strings.Join(lines, "\n") + "\n"
}

// prepare lays out the private apt state of arch and reports whether its sources changed (which
// forces a refresh of the lists).
func (d *debian) prepare(arch string) (conf string, changed bool, err error) {
	dir, err := filepath.Abs(d.aptDir(arch))
	if err != nil {
		return "", false, err
	}
	for _, sub := range []string{"state/lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o750); err != nil {
			return "", false, err
		}
	}
	status := filepath.Join(dir, "state", "status")
	if _, err := os.Stat(status); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(status, nil, 0o644); err != nil { // #nosec G306 -- apt's status file is world-readable
			return "", false, err
		}
	}
	conf = filepath.Join(dir, "apt.conf")
	for file, content := range map[string]string{conf: d.config(arch, dir), filepath.Join(dir, "sources.list"): d.sources()} {
		old, err := os.ReadFile(file) // #nosec G304 -- our own cache directory
		if err == nil && string(old) == content {
			continue
		}
		changed = true
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil { // #nosec G306 -- apt configuration, world-readable like /etc/apt
			return "", false, err
		}
	}
	return conf, changed, nil
}

// aptGet runs apt-get with the private configuration of arch in directory dir.
func (d *debian) aptGet(ctx context.Context, arch, dir string, args ...string) ([]byte, error) {
	conf, _, err := d.prepare(arch)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "apt-get", append([]string{"-c", conf, "-q"}, args...)...) // #nosec G204 -- package names are ours
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return nil, errors.New("apt-get is missing: building the images needs Debian's apt and dpkg-deb")
		}
		return nil, fmt.Errorf("apt-get %s (%s): %w\n%s%s", strings.Join(args, " "), arch, err, out, stderr.Bytes())
	}
	return out, nil
}

// update refreshes the private lists of arch when they are older than MaxAge or the sources changed.
func (d *debian) update(ctx context.Context, arch string) error {
	_, changed, err := d.prepare(arch)
	if err != nil {
		return err
	}
	stamp := filepath.Join(d.aptDir(arch), "updated")
	if st, err := os.Stat(stamp); err == nil && !changed && time.Since(st.ModTime()) < d.MaxAge {
		return nil
	}
	d.logf(">> apt-get update (%s, private lists under %s)", arch, d.aptDir(arch))
	if _, err := d.aptGet(ctx, arch, d.Dir, "update"); err != nil {
		return err
	}
	return os.WriteFile(stamp, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644) // #nosec G306 -- a timestamp
}

// debFile is one line of apt-get download --print-uris.
type debFile struct {
	Package string
	File    string
	SHA256  string
}

// parsePrintURIs reads `'<uri>' <file> <size> SHA256:<hex>` lines.
func parsePrintURIs(out []byte) ([]debFile, error) {
	var files []debFile
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 || !strings.HasPrefix(f[3], "SHA256:") || !strings.HasSuffix(f[1], ".deb") {
			return nil, fmt.Errorf("unexpected apt-get --print-uris line %q", line)
		}
		pkg, _, _ := strings.Cut(f[1], "_")
		files = append(files, debFile{Package: pkg, File: f[1], SHA256: strings.TrimPrefix(f[3], "SHA256:")})
	}
	return files, nil
}

// fetch returns the paths of the .deb files of pkgs (their candidate versions for arch), from the
// cache when a file with the expected SHA-256 is there, downloading the others with apt-get
// download.
func (d *debian) fetch(ctx context.Context, arch string, pkgs []string) (map[string]string, error) {
	if err := d.update(ctx, arch); err != nil {
		return nil, err
	}
	out, err := d.aptGet(ctx, arch, d.Dir, append([]string{"download", "--print-uris"}, pkgs...)...)
	if err != nil {
		return nil, err
	}
	files, err := parsePrintURIs(out)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(d.debDir(), 0o750); err != nil {
		return nil, err
	}
	paths := map[string]string{}
	var missing []debFile
	for _, f := range files {
		p := filepath.Join(d.debDir(), f.File)
		if sum, err := fileSHA256(p); err != nil || sum != f.SHA256 {
			missing = append(missing, f)
		}
		paths[f.Package] = p
	}
	if len(missing) > 0 {
		if err := d.download(ctx, arch, missing); err != nil {
			return nil, err
		}
	}
	for _, pkg := range pkgs {
		if paths[pkg] == "" {
			return nil, fmt.Errorf("apt-get download --print-uris named no file for package %s (%s)", pkg, arch)
		}
	}
	return paths, nil
}

// download fetches files with apt-get download into a temporary directory beside the cache,
// checks each one's SHA-256 and moves it into the cache.
func (d *debian) download(ctx context.Context, arch string, files []debFile) error {
	tmp, err := os.MkdirTemp(d.debDir(), ".download-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = f.Package
	}
	d.logf(">> apt-get download %s (%s)", strings.Join(names, " "), arch)
	if _, err := d.aptGet(ctx, arch, tmp, append([]string{"download"}, names...)...); err != nil {
		return err
	}
	for _, f := range files {
		src := filepath.Join(tmp, f.File)
		sum, err := fileSHA256(src)
		if err != nil {
			return fmt.Errorf("apt-get download did not write %s: %w", f.File, err)
		}
		if sum != f.SHA256 {
			return fmt.Errorf("%s: SHA-256 %s, the archive says %s", f.File, sum, f.SHA256)
		}
		if err := os.Rename(src, filepath.Join(d.debDir(), f.File)); err != nil {
			return err
		}
	}
	return nil
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p) // #nosec G304 -- a .deb in our cache
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// dpkgDeb runs dpkg-deb with args and returns its standard output.
func dpkgDeb(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "dpkg-deb", args...) // #nosec G204 -- paths of our cache
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return nil, errors.New("dpkg-deb is missing: building the images needs Debian's apt and dpkg-deb")
		}
		return nil, fmt.Errorf("dpkg-deb %s: %w: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out, nil
}

// depends returns the package names a .deb depends on (Pre-Depends and Depends; the first of
// each set of alternatives, without version or architecture qualifiers).
func depends(ctx context.Context, deb string) ([]string, error) {
	out, err := dpkgDeb(ctx, "--field", deb, "Pre-Depends", "Depends")
	if err != nil {
		return nil, err
	}
	return parseDepends(string(out)), nil
}

// parseDepends reads the output of dpkg-deb --field with one or more relationship fields.
func parseDepends(fields string) []string {
	seen := map[string]bool{}
	var names []string
	for _, line := range strings.Split(fields, "\n") {
		if _, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, " ") {
			line = v
		}
		for _, rel := range strings.Split(line, ",") {
			alt, _, _ := strings.Cut(rel, "|")
			name := strings.Fields(alt)
			if len(name) == 0 {
				continue
			}
			n, _, _ := strings.Cut(name[0], ":")
			n, _, _ = strings.Cut(n, "(")
			if n != "" && !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	sort.Strings(names)
	return names
}
