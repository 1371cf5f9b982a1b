package main

import (
	"bytes"
	"context"
	"reflect"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/kmm-project/kmm/fsm"
)

// TestFlagsAnywhere checks that flags may come before, between or after the command and its
// arguments, as kubectl's do, and that everything after -- is an argument.
func TestFlagsAnywhere(t *testing.T) {
	type parsed struct {
		kubeconfig, context, namespace, as, output, format string
		width                                              int
		args                                               []string
	}
	cases := map[string]struct {
		args []string
		want parsed
	}{
		"flags after the command": {
			args: []string{"status", "nic", "-n", "drivers", "-o", "json"},
			want: parsed{namespace: "drivers", output: "json", args: []string{"nic"}},
		},
		"flags before the command": {
			args: []string{"--kubeconfig", "/k", "--context=c", "history", "node-1", "--namespace=drivers", "nic"},
			want: parsed{kubeconfig: "/k", context: "c", namespace: "drivers", args: []string{"node-1", "nic"}},
		},
		"after -- everything is an argument": {
			args: []string{"history", "--", "-odd-node"},
			want: parsed{args: []string{"-odd-node"}},
		},
		"diagram format and width": {
			args: []string{"diagram", "--format", "dot", "--width=120"},
			want: parsed{format: "dot", width: 120, args: []string{}},
		},
		"kubectl's connection flags": {
			args: []string{"status", "--as", "alice", "-o", "jsonpath={.items[*].state}"},
			want: parsed{as: "alice", output: "jsonpath={.items[*].state}", args: []string{}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := newRootOptions(genericiooptions.NewTestIOStreamsDiscard())
			cmd, rest, err := o.command().Find(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.ParseFlags(rest); err != nil {
				t.Fatal(err)
			}
			flag := func(name string) string {
				if f := cmd.Flags().Lookup(name); f != nil {
					return f.Value.String()
				}
				return ""
			}
			got := parsed{kubeconfig: *o.config.KubeConfig, context: *o.config.Context, namespace: *o.config.Namespace,
				as: *o.config.Impersonate, output: flag("output"), width: o.width, args: cmd.Flags().Args()}
			if f := flag("format"); f != "mermaid" {
				got.format = f
			}
			if tc.want.args == nil {
				tc.want.args = []string{}
			}
			if got.args == nil {
				got.args = []string{}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%v\n got %+v\nwant %+v", tc.args, got, tc.want)
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
		"help":                 {args: []string{"--help"}, out: "kubectl kmm [command]"},
		"help command":         {args: []string{"help", "history"}, out: "kubectl kmm history <node>"},
		"no command":           {args: nil, err: "missing command", log: "Usage:"},
		"unknown command":      {args: []string{"statuz"}, err: `unknown command "statuz"`},
		"unknown flag":         {args: []string{"status", "--bogus"}, err: "unknown flag: --bogus"},
		"bad output":           {args: []string{"status", "-o", "bogus"}, err: `unknown output format "bogus"`},
		"bad history output":   {args: []string{"history", "n", "-o", "bogus"}, err: `unknown output format "bogus"`},
		"history needs node":   {args: []string{"history"}, err: "history needs a node"},
		"two modules":          {args: []string{"status", "a/b", "c/d"}, err: "at most one module"},
		"diagram bad format":   {args: []string{"diagram", "--format", "svg"}, err: `unknown diagram format "svg"`},
		"diagram mermaid":      {args: []string{"diagram"}, out: fsm.Mermaid()},
		"diagram dot":          {args: []string{"diagram", "--format", "dot"}, out: "digraph {"},
		"missing kubeconfig":   {args: []string{"status", "--kubeconfig", "testdata/none"}, err: "loading the kubeconfig"},
		"diagram takes no arg": {args: []string{"diagram", "x"}, err: "diagram takes no arguments"},
		"bash completion":      {args: []string{"completion", "bash"}, out: "__start_kmm"},
		"zsh completion":       {args: []string{"completion", "zsh"}, out: "#compdef kmm"},
		"complete -o":          {args: []string{"__complete", "status", "-o", ""}, out: "jsonpath\n"},
		"complete commands":    {args: []string{"__complete", ""}, out: "history"},
		"complete contexts": {args: []string{"__complete", "status", "--kubeconfig", "testdata/two-contexts", "--context", ""},
			out: "blue\nred\n"},
		"complete users": {args: []string{"__complete", "--kubeconfig", "testdata/two-contexts", "history", "--user", ""},
			out: "alice\nbob\n"},
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
