package kernelview

import (
	"reflect"
	"testing"
)

func TestParseProcModules(t *testing.T) {
	in := "kmm_e2e 16384 1 - Live 0xffffffffc0a00000 (OE)\n" +
		"bridge 311296 1 br_netfilter, Live 0xffffffffc0900000\n" +
		"stp 16384 1 bridge, Live 0x0\n" +
		"llc 16384 2 bridge,stp, Live 0x0\n" +
		"gone 16384 0 - Unloading 0x0\n" +
		"short line\n"
	got := ParseProcModules(in)
	want := map[string]Module{
		"kmm_e2e": {Loaded: true, State: "Live", RefCount: 1},
		"bridge":  {Loaded: true, State: "Live", RefCount: 1, Holders: []string{"br_netfilter"}},
		"stp":     {Loaded: true, State: "Live", RefCount: 1, Holders: []string{"bridge"}},
		"llc":     {Loaded: true, State: "Live", RefCount: 2, Holders: []string{"bridge", "stp"}},
		"gone":    {Loaded: true, State: "Unloading"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseProcModules:\n got %+v\nwant %+v", got, want)
	}
}

func TestKmsgText(t *testing.T) {
	for in, want := range map[string]string{
		"6,1234,5678901,-;kmm_e2e: version v1 loaded\n": "kmm_e2e: version v1 loaded",
		"3,1,0,c;a;b":     "a;b",
		" SUBSYSTEM=misc": "",
		"no separator":    "",
	} {
		got, ok := KmsgText(in)
		if got != want || ok != (want != "") {
			t.Errorf("KmsgText(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}
