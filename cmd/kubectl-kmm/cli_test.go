package main

import (
	"bytes"
	"context"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/kmm-project/kmm/fsm"
)

func TestParseArgs(t *testing.T) {
	cases := map[string]struct {
		args []string
		want options
	}{
		"flags after the command": {
			args: []string{"status", "nic", "-n", "drivers", "-o", "json"},
			want: options{namespace: "drivers", output: "json", args: []string{"status", "nic"}},
		},
		"flags before the command": {
			args: []string{"--kubeconfig", "/k", "--context=c", "history", "node-1", "--namespace=drivers", "nic"},
			want: options{kubeconfig: "/k", context: "c", namespace: "drivers", args: []string{"history", "node-1", "nic"}},
		},
		"after -- everything is an argument": {
			args: []string{"history", "--", "-odd-node"},
			want: options{args: []string{"history", "-odd-node"}},
		},
		"diagram format and width": {
			args: []string{"diagram", "--format", "dot", "--width=120"},
			want: options{format: "dot", width: 120, args: []string{"diagram"}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := parseArgs(tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.format == "" {
				tc.want.format = "mermaid"
			}
			got.requestTimeout = 0
			if !reflect.DeepEqual(*got, tc.want) {
				t.Errorf("parseArgs(%v)\n got %+v\nwant %+v", tc.args, *got, tc.want)
			}
		})
	}
}

func TestModuleArg(t *testing.T) {
	cases := map[string]struct {
		arg, ns string
		want    moduleFilter
		err     string
	}{
		"qualified":         {arg: "drivers/nic", ns: "default", want: moduleFilter{"drivers", "nic"}},
		"name in namespace": {arg: "nic", ns: "drivers", want: moduleFilter{"drivers", "nic"}},
		"empty namespace":   {arg: "/nic", err: "want <namespace>/<name>"},
		"too many slashes":  {arg: "a/b/c", err: "want <namespace>/<name>"},
	}
	for name, tc := range cases {
		got, err := moduleArg(tc.arg, tc.ns)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", name, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", name, got, err, tc.want)
		}
	}
}

// TestRunWithoutACluster covers what needs no API server: usage, argument errors and diagram.
func TestRunWithoutACluster(t *testing.T) {
	cases := map[string]struct {
		args          []string
		err, out, log string
	}{
		"help":                 {args: []string{"--help"}, log: "kubectl kmm status"},
		"help command":         {args: []string{"help"}, out: "kubectl kmm history <node>"},
		"no command":           {args: nil, err: "missing command", log: "Usage:"},
		"unknown command":      {args: []string{"statuz"}, err: `unknown command "statuz"`},
		"unknown flag":         {args: []string{"status", "--bogus"}, err: "flag provided but not defined: -bogus"},
		"bad output":           {args: []string{"status", "-o", "yaml"}, err: `unknown output format "yaml"`},
		"history needs node":   {args: []string{"history"}, err: "history needs a node"},
		"two modules":          {args: []string{"status", "a/b", "c/d"}, err: "at most one module"},
		"diagram bad format":   {args: []string{"diagram", "--format", "svg"}, err: `unknown diagram format "svg"`},
		"diagram mermaid":      {args: []string{"diagram"}, out: fsm.Mermaid()},
		"diagram dot":          {args: []string{"diagram", "--format", "dot"}, out: "digraph {"},
		"missing kubeconfig":   {args: []string{"status", "--kubeconfig", "testdata/none"}, err: "loading the kubeconfig"},
		"diagram takes no arg": {args: []string{"diagram", "x"}, err: "diagram takes no arguments"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var out, log bytes.Buffer
			err := run(context.Background(), tc.args, &out, &log)
			if tc.err == "" && err != nil {
				t.Fatalf("run(%v) = %v", tc.args, err)
			}
			if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("run(%v) = %v, want an error containing %q", tc.args, err, tc.err)
			}
			if !strings.Contains(out.String(), tc.out) || !strings.Contains(log.String(), tc.log) {
				t.Errorf("run(%v): stdout\n%s\nstderr\n%s\nwant %q and %q", tc.args, out.String(), log.String(), tc.out, tc.log)
			}
		})
	}
}
