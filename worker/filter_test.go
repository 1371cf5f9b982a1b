package worker

import (
	"archive/tar"
	"strings"
	"testing"
)

func TestPlanEntry(t *testing.T) {
	f := filter{Dirs: []string{"opt/lib/modules/6.1.0-k", "firmware"}}
	cases := []struct {
		name    string
		hdr     tar.Header
		want    entryPlan
		wantErr string
	}{
		{"module file", tar.Header{Name: "opt/lib/modules/6.1.0-k/extra/a.ko", Typeflag: tar.TypeReg}, entryPlan{Action: fileEntry, Path: "opt/lib/modules/6.1.0-k/extra/a.ko"}, ""},
		{"dot slash prefix", tar.Header{Name: "./opt/lib/modules/6.1.0-k/", Typeflag: tar.TypeDir}, entryPlan{Action: mkdirEntry, Path: "opt/lib/modules/6.1.0-k"}, ""},
		{"firmware", tar.Header{Name: "firmware/x.bin", Typeflag: tar.TypeReg}, entryPlan{Action: fileEntry, Path: "firmware/x.bin"}, ""},
		{"other kernel skipped", tar.Header{Name: "opt/lib/modules/6.1.0-kk/a.ko", Typeflag: tar.TypeReg}, entryPlan{}, ""},
		{"parent dir skipped", tar.Header{Name: "opt/lib/", Typeflag: tar.TypeDir}, entryPlan{}, ""},
		{"outside skipped", tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg}, entryPlan{}, ""},
		{"root skipped", tar.Header{Name: "./", Typeflag: tar.TypeDir}, entryPlan{}, ""},
		{"device outside skipped", tar.Header{Name: "dev/null", Typeflag: tar.TypeChar}, entryPlan{}, ""},
		{"absolute", tar.Header{Name: "/opt/lib/modules/6.1.0-k/a.ko", Typeflag: tar.TypeReg}, entryPlan{}, "absolute path"},
		{"absolute outside", tar.Header{Name: "/etc/x", Typeflag: tar.TypeReg}, entryPlan{}, "absolute path"},
		{"dotdot", tar.Header{Name: "opt/lib/modules/6.1.0-k/../../../../etc/x", Typeflag: tar.TypeReg}, entryPlan{}, `".." path component`},
		{"dotdot outside", tar.Header{Name: "../x", Typeflag: tar.TypeReg}, entryPlan{}, `".." path component`},
		{"device", tar.Header{Name: "opt/lib/modules/6.1.0-k/sda", Typeflag: tar.TypeBlock}, entryPlan{}, "device file"},
		{"char device", tar.Header{Name: "firmware/null", Typeflag: tar.TypeChar}, entryPlan{}, "device file"},
		{"fifo", tar.Header{Name: "firmware/p", Typeflag: tar.TypeFifo}, entryPlan{}, "fifo"},
		{"symlink inside", tar.Header{Name: "opt/lib/modules/6.1.0-k/l.ko", Typeflag: tar.TypeSymlink, Linkname: "extra/a.ko"}, entryPlan{Action: symlinkEntry, Path: "opt/lib/modules/6.1.0-k/l.ko", Target: "extra/a.ko"}, ""},
		{"symlink up but inside", tar.Header{Name: "opt/lib/modules/6.1.0-k/fw", Typeflag: tar.TypeSymlink, Linkname: "../../../../firmware"}, entryPlan{Action: symlinkEntry, Path: "opt/lib/modules/6.1.0-k/fw", Target: "../../../../firmware"}, ""},
		{"symlink escaping", tar.Header{Name: "opt/lib/modules/6.1.0-k/l", Typeflag: tar.TypeSymlink, Linkname: "../../../../../etc/shadow"}, entryPlan{}, "points outside the extraction root"},
		{"absolute symlink rewritten", tar.Header{Name: "opt/lib/modules/6.1.0-k/build", Typeflag: tar.TypeSymlink, Linkname: "/usr/src/linux"}, entryPlan{Action: symlinkEntry, Path: "opt/lib/modules/6.1.0-k/build", Target: "../../../../usr/src/linux"}, ""},
		{"absolute symlink to root", tar.Header{Name: "firmware/r", Typeflag: tar.TypeSymlink, Linkname: "/"}, entryPlan{Action: symlinkEntry, Path: "firmware/r", Target: ".."}, ""},
		{"empty symlink", tar.Header{Name: "firmware/r", Typeflag: tar.TypeSymlink}, entryPlan{}, "empty or invalid target"},
		{"hardlink inside", tar.Header{Name: "firmware/b", Typeflag: tar.TypeLink, Linkname: "firmware/a"}, entryPlan{Action: hardlinkEntry, Path: "firmware/b", Target: "firmware/a"}, ""},
		{"hardlink absolute", tar.Header{Name: "firmware/b", Typeflag: tar.TypeLink, Linkname: "/etc/shadow"}, entryPlan{}, "outside the extraction root"},
		{"hardlink dotdot", tar.Header{Name: "firmware/b", Typeflag: tar.TypeLink, Linkname: "../etc/shadow"}, entryPlan{}, "outside the extraction root"},
		{"hardlink to unextracted", tar.Header{Name: "firmware/b", Typeflag: tar.TypeLink, Linkname: "etc/shadow"}, entryPlan{}, "outside the extracted directories"},
		{"whiteout inside", tar.Header{Name: "opt/lib/modules/6.1.0-k/.wh.a.ko", Typeflag: tar.TypeReg}, entryPlan{Action: whiteoutEntry, Path: "opt/lib/modules/6.1.0-k/a.ko"}, ""},
		{"whiteout of a parent", tar.Header{Name: "opt/lib/.wh.modules", Typeflag: tar.TypeReg}, entryPlan{Action: whiteoutEntry, Path: "opt/lib/modules"}, ""},
		{"whiteout elsewhere", tar.Header{Name: "etc/.wh.x", Typeflag: tar.TypeReg}, entryPlan{}, ""},
		{"opaque", tar.Header{Name: "firmware/.wh..wh..opq", Typeflag: tar.TypeReg}, entryPlan{Action: opaqueEntry, Path: "firmware"}, ""},
		{"opaque at root", tar.Header{Name: ".wh..wh..opq", Typeflag: tar.TypeReg}, entryPlan{Action: opaqueEntry, Path: "."}, ""},
		{"sparse", tar.Header{Name: "firmware/s", Typeflag: tar.TypeGNUSparse}, entryPlan{}, "unsupported entry type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := planEntry(&tc.hdr, f)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), tc.hdr.Name) {
					t.Fatalf("error = %v, want one naming %q and saying %q", err, tc.hdr.Name, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("plan = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestImageRel(t *testing.T) {
	for in, want := range map[string]string{"/opt": "opt", "opt/": "opt", "/": "", "": "", "/../../opt/x/..": "opt", "/a//b": "a/b"} {
		if got := imageRel(in); got != want {
			t.Errorf("imageRel(%q) = %q, want %q", in, got, want)
		}
	}
}
