package main

import (
	"archive/tar"
	"slices"
	"testing"
	"time"
)

func TestCanonical(t *testing.T) {
	for in, want := range map[string]string{
		"./bin/kmod":                "usr/bin/kmod",
		"./sbin/modprobe":           "usr/sbin/modprobe",
		"./lib/x86_64-linux-gnu/x":  "usr/lib/x86_64-linux-gnu/x",
		"./lib64/ld-linux.so.2":     "usr/lib64/ld-linux.so.2",
		"./usr/share/doc":           "usr/share/doc",
		"./etc/modprobe.d/":         "etc/modprobe.d",
		"./libexec/x":               "libexec/x",
		"./":                        "",
		"../../etc/passwd":          "etc/passwd",
		"/usr/lib/../bin/../../lib": "usr/lib",
	} {
		if got := canonical(in); got != want {
			t.Errorf("canonical(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseDepends(t *testing.T) {
	out := "Pre-Depends: libc6 (>= 2.34)\nDepends: libc6 (>= 2.34), liblzma5 (>= 5.1.1alpha+20120614), debconf (>= 0.5) | debconf-2.0,\n libssl3:any (>= 3.0.0), libzstd1 (>= 1.5.2)\n"
	want := []string{"debconf", "libc6", "liblzma5", "libssl3", "libzstd1"}
	if got := parseDepends(out); !slices.Equal(got, want) {
		t.Errorf("parseDepends = %q, want %q", got, want)
	}
	if got := parseDepends(""); len(got) != 0 {
		t.Errorf("parseDepends(\"\") = %q", got)
	}
}

func TestParsePrintURIs(t *testing.T) {
	out := "'http://deb.debian.org/debian/pool/main/k/kmod/kmod_30%2b20221128-1_amd64.deb' kmod_30+20221128-1_amd64.deb 95180 SHA256:e21a\n" +
		"'http://deb.debian.org/debian-security/pool/updates/main/o/openssl/libssl3_3.0.22-1%7edeb12u2_amd64.deb' libssl3_3.0.22-1~deb12u2_amd64.deb 1 SHA256:3d04\n"
	got, err := parsePrintURIs([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := []debFile{{"kmod", "kmod_30+20221128-1_amd64.deb", "e21a"}, {"libssl3", "libssl3_3.0.22-1~deb12u2_amd64.deb", "3d04"}}
	if !slices.Equal(got, want) {
		t.Errorf("parsePrintURIs = %+v, want %+v", got, want)
	}
	if _, err := parsePrintURIs([]byte("E: Unable to locate package nope\n")); err == nil {
		t.Error("parsePrintURIs accepted an error line")
	}
}

func TestResolve(t *testing.T) {
	tr := newTree()
	reg := func(p string) { tr[p] = &node{Type: tar.TypeReg, Data: []byte(p)} }
	link := func(p, target string) { tr[p] = &node{Type: tar.TypeSymlink, Link: target} }
	for _, d := range []string{"usr", "usr/bin", "usr/sbin", "usr/lib", "usr/lib/x86_64-linux-gnu", "usr/lib64"} {
		tr[d] = &node{Type: tar.TypeDir}
	}
	reg("usr/bin/kmod")
	link("usr/sbin/modprobe", "/bin/kmod")
	reg("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
	link("usr/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
	reg("usr/lib/x86_64-linux-gnu/libzstd.so.1.5.4")
	link("usr/lib/x86_64-linux-gnu/libzstd.so.1", "libzstd.so.1.5.4")
	link("usr/lib/x86_64-linux-gnu/up", "../../bin/kmod")
	link("usr/bin/loop", "loop")
	for _, c := range []struct {
		in      string
		file    string
		visited []string
	}{
		{"/sbin/modprobe", "usr/bin/kmod", []string{"sbin", "usr/sbin/modprobe", "bin", "usr/bin/kmod"}},
		{"usr/sbin/modprobe", "usr/bin/kmod", []string{"usr/sbin/modprobe", "bin", "usr/bin/kmod"}},
		{"/lib64/ld-linux-x86-64.so.2", "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
			[]string{"lib64", "usr/lib64/ld-linux-x86-64.so.2", "lib", "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"}},
		{"/lib/x86_64-linux-gnu/libzstd.so.1", "usr/lib/x86_64-linux-gnu/libzstd.so.1.5.4",
			[]string{"lib", "usr/lib/x86_64-linux-gnu/libzstd.so.1", "usr/lib/x86_64-linux-gnu/libzstd.so.1.5.4"}},
		{"/usr/lib/x86_64-linux-gnu/up", "usr/bin/kmod", []string{"usr/lib/x86_64-linux-gnu/up", "usr/bin/kmod"}},
	} {
		file, visited, err := tr.resolve(c.in)
		if err != nil || file != c.file || !slices.Equal(visited, c.visited) {
			t.Errorf("resolve(%q) = %q, %q, %v; want %q, %q", c.in, file, visited, err, c.file, c.visited)
		}
	}
	for _, bad := range []string{"/usr/bin/loop", "/usr/bin/missing", "/usr/bin/kmod/x", "/usr/bin", "/lib64"} {
		if file, _, err := tr.resolve(bad); err == nil {
			t.Errorf("resolve(%q) = %q, want an error", bad, file)
		}
	}
}

func TestParseEpoch(t *testing.T) {
	for in, want := range map[string]int64{"": 0, "0": 0, "1700000000": 1700000000, " 42\n": 42} {
		got, err := parseEpoch(in)
		if err != nil || !got.Equal(time.Unix(want, 0)) {
			t.Errorf("parseEpoch(%q) = %s, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"-1", "yesterday", "1.5"} {
		if _, err := parseEpoch(bad); err == nil {
			t.Errorf("parseEpoch(%q) accepted", bad)
		}
	}
}
